--
-- PostgreSQL database dump
--

\restrict q3EdwRnOjb1V2KLyMvjveGYleY6Z1oDLcicNPUaxAUzgLmkTYivj4RBUiNK6dIS

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: alerts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alerts (
    id integer NOT NULL,
    notification_id integer NOT NULL,
    received_at timestamp with time zone NOT NULL,
    fingerprint character varying(32) NOT NULL,
    starts_at timestamp with time zone NOT NULL,
    status character varying(16) NOT NULL,
    alert json NOT NULL
);


--
-- Name: alerts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.alerts_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: alerts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.alerts_id_seq OWNED BY public.alerts.id;


--
-- Name: decision_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.decision_events (
    id integer NOT NULL,
    decision_id integer NOT NULL,
    at timestamp with time zone NOT NULL,
    state character varying(24) NOT NULL,
    detail json NOT NULL
);


--
-- Name: decision_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.decision_events_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: decision_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.decision_events_id_seq OWNED BY public.decision_events.id;


--
-- Name: decisions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.decisions (
    id integer NOT NULL,
    at timestamp with time zone NOT NULL,
    incident character varying(64) NOT NULL,
    job integer,
    action character varying(16) NOT NULL,
    cause character varying(32) NOT NULL,
    nodes json NOT NULL,
    exclude json NOT NULL,
    reason text NOT NULL,
    evidence json NOT NULL,
    fault_at timestamp with time zone,
    guard character varying(48),
    mode character varying(16) NOT NULL,
    state character varying(24) NOT NULL
);


--
-- Name: decisions_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.decisions_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: decisions_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.decisions_id_seq OWNED BY public.decisions.id;


--
-- Name: incidents; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.incidents (
    key character varying(64) NOT NULL,
    job integer,
    node character varying(64),
    opened_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone NOT NULL,
    evidence json NOT NULL
);


--
-- Name: notifications; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.notifications (
    id integer NOT NULL,
    received_at timestamp with time zone NOT NULL,
    remote character varying(64) NOT NULL,
    group_key text NOT NULL,
    payload json NOT NULL
);


--
-- Name: notifications_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.notifications_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: notifications_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.notifications_id_seq OWNED BY public.notifications.id;


--
-- Name: recoveries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.recoveries (
    incident character varying(64) NOT NULL,
    job integer NOT NULL,
    attempt integer NOT NULL,
    cause character varying(32) NOT NULL,
    fault_at timestamp with time zone NOT NULL,
    requeued_at timestamp with time zone NOT NULL,
    failed_step double precision,
    checkpoint_step double precision,
    work_lost_seconds double precision,
    state character varying(16) NOT NULL,
    reason text NOT NULL,
    decided_at timestamp with time zone,
    restored_seconds double precision,
    before_checkpoint boolean NOT NULL
);


--
-- Name: settings; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.settings (
    key character varying(64) NOT NULL,
    value json NOT NULL,
    updated_at timestamp with time zone NOT NULL
);


--
-- Name: alerts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alerts ALTER COLUMN id SET DEFAULT nextval('public.alerts_id_seq'::regclass);


--
-- Name: decision_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decision_events ALTER COLUMN id SET DEFAULT nextval('public.decision_events_id_seq'::regclass);


--
-- Name: decisions id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions ALTER COLUMN id SET DEFAULT nextval('public.decisions_id_seq'::regclass);


--
-- Name: notifications id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.notifications ALTER COLUMN id SET DEFAULT nextval('public.notifications_id_seq'::regclass);


--
-- Data for Name: alerts; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.alerts VALUES (1, 1, '2026-11-29 12:00:00+00', 'a7ac28e2c53d0ec4', '2026-11-29 12:00:00+00', 'firing', '{"status": "firing", "labels": {"alertname": "GpuXidNodeFault", "node": "gpu01", "signal": "gpu_hw"}, "annotations": {"summary": "XID 79 on gpu01"}, "startsAt": "2026-11-29T12:00:00Z", "fingerprint": "a7ac28e2c53d0ec4"}');
INSERT INTO public.alerts VALUES (2, 1, '2026-11-29 12:00:00+00', 'acd574cd0e66172f', '2026-11-29 12:00:00+00', 'firing', '{"status": "firing", "labels": {"alertname": "GpuXidNodeFault", "node": "gpu02", "signal": "gpu_hw"}, "annotations": {"summary": "XID 79 on gpu02"}, "startsAt": "2026-11-29T12:00:00Z", "fingerprint": "acd574cd0e66172f"}');


--
-- Data for Name: decision_events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.decision_events VALUES (1, 1, '2026-11-29 12:00:20+00', 'pending', '{"by": "engine"}');
INSERT INTO public.decision_events VALUES (2, 2, '2026-11-29 12:00:20+00', 'pending', '{"by": "engine"}');
INSERT INTO public.decision_events VALUES (3, 1, '2026-11-29 12:00:22+00', 'running', '{"by": "executor"}');
INSERT INTO public.decision_events VALUES (4, 1, '2026-11-29 12:00:25+00', 'executed', '{"by": "executor"}');
INSERT INTO public.decision_events VALUES (5, 2, '2026-11-29 12:00:25+00', 'running', '{"by": "executor"}');
INSERT INTO public.decision_events VALUES (6, 2, '2026-11-29 12:00:28+00', 'executed', '{"by": "executor"}');
INSERT INTO public.decision_events VALUES (7, 1, '2026-11-29 12:00:40+00', 'note', '{"by": "executor", "diagnostics": {"nodes": {}}}');


--
-- Data for Name: decisions; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.decisions VALUES (1, '2026-11-29 12:00:20+00', '7.0', 7, 'drain', 'gpu_hardware', '["gpu01"]', '[]', 'XID 79 on gpu01', '[{"alertname": "GpuXidNodeFault", "node": "gpu01", "fingerprint": "f1", "startsAt": "2026-11-29T12:00:00Z"}]', '2026-11-29 12:00:00+00', NULL, 'enforce', 'executed');
INSERT INTO public.decisions VALUES (2, '2026-11-29 12:00:20+00', '7.0', 7, 'requeue', 'gpu_hardware', '[]', '["gpu01"]', 'from its checkpoint', '[{"alertname": "GpuXidNodeFault", "node": "gpu01", "fingerprint": "f1", "startsAt": "2026-11-29T12:00:00Z"}]', '2026-11-29 12:00:00+00', NULL, 'enforce', 'executed');


--
-- Data for Name: incidents; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.incidents VALUES ('7.0', 7, NULL, '2026-11-29 12:00:00+00', '2026-11-29 12:00:20+00', '[]');


--
-- Data for Name: notifications; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.notifications VALUES (1, '2026-11-29 12:00:00+00', '10.0.0.9', '{}:{alertname=GpuXidNodeFault}', '{"status": "firing", "groupKey": "{}:{alertname=GpuXidNodeFault}", "alerts": [{"status": "firing", "labels": {"alertname": "GpuXidNodeFault", "node": "gpu01", "signal": "gpu_hw"}, "annotations": {"summary": "XID 79 on gpu01"}, "startsAt": "2026-11-29T12:00:00Z"}, {"status": "firing", "labels": {"alertname": "GpuXidNodeFault", "node": "gpu02", "signal": "gpu_hw"}, "annotations": {"summary": "XID 79 on gpu02"}, "startsAt": "2026-11-29T12:00:00Z"}]}');


--
-- Data for Name: recoveries; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.recoveries VALUES ('7.0', 7, 0, 'gpu_hardware', '2026-11-29 12:00:00+00', '2026-11-29 12:00:28+00', 120, 100, 45, 'recovered', 'passed step 120', '2026-11-29 12:10:00+00', 300, false);


--
-- Data for Name: settings; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.settings VALUES ('breaker', '{"open": false, "reset_at": "2026-11-29T11:00:00+00:00"}', '2026-11-29 11:00:00+00');
INSERT INTO public.settings VALUES ('switch', '{"monitor": true}', '2026-11-29 12:00:00+00');
INSERT INTO public.settings VALUES ('loop', '{"at": 1795953600.0}', '2026-11-29 12:00:00+00');
INSERT INTO public.settings VALUES ('jobs', '{"7": {"partition": "train", "restarts": 1, "eligible": true}}', '2026-11-29 12:00:00+00');
INSERT INTO public.settings VALUES ('nodes', '{"gpu01": {"status": "drained", "partitions": ["train"]}}', '2026-11-29 12:00:00+00');


--
-- Name: alerts_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.alerts_id_seq', 2, true);


--
-- Name: decision_events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.decision_events_id_seq', 7, true);


--
-- Name: decisions_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.decisions_id_seq', 2, true);


--
-- Name: notifications_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.notifications_id_seq', 1, true);


--
-- Name: alerts alerts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alerts
    ADD CONSTRAINT alerts_pkey PRIMARY KEY (id);


--
-- Name: decision_events decision_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decision_events
    ADD CONSTRAINT decision_events_pkey PRIMARY KEY (id);


--
-- Name: decisions decisions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions
    ADD CONSTRAINT decisions_pkey PRIMARY KEY (id);


--
-- Name: incidents incidents_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.incidents
    ADD CONSTRAINT incidents_pkey PRIMARY KEY (key);


--
-- Name: notifications notifications_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.notifications
    ADD CONSTRAINT notifications_pkey PRIMARY KEY (id);


--
-- Name: recoveries recoveries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.recoveries
    ADD CONSTRAINT recoveries_pkey PRIMARY KEY (incident);


--
-- Name: settings settings_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (key);


--
-- Name: alerts uq_alert_event; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alerts
    ADD CONSTRAINT uq_alert_event UNIQUE (fingerprint, starts_at, status);


--
-- Name: ix_decision_events_decision_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_decision_events_decision_id ON public.decision_events USING btree (decision_id);


--
-- Name: ix_decision_incident; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_decision_incident ON public.decisions USING btree (incident);


--
-- Name: ix_decisions_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_decisions_at ON public.decisions USING btree (at);


--
-- Name: ix_notifications_received_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_notifications_received_at ON public.notifications USING btree (received_at);


--
-- Name: ix_recoveries_job; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_recoveries_job ON public.recoveries USING btree (job);


--
-- Name: ix_recoveries_state; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_recoveries_state ON public.recoveries USING btree (state);


--
-- Name: alerts alerts_notification_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alerts
    ADD CONSTRAINT alerts_notification_id_fkey FOREIGN KEY (notification_id) REFERENCES public.notifications(id);


--
-- Name: decision_events decision_events_decision_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decision_events
    ADD CONSTRAINT decision_events_decision_id_fkey FOREIGN KEY (decision_id) REFERENCES public.decisions(id);


--
-- PostgreSQL database dump complete
--

\unrestrict q3EdwRnOjb1V2KLyMvjveGYleY6Z1oDLcicNPUaxAUzgLmkTYivj4RBUiNK6dIS

