"""The pure core: alerts, a cluster view, history, policy and time in; decisions out.

No I/O, no clock reads, no globals (docs/layout.md): the same code runs behind the webhook, in
`slurmedic replay` and in tests.
"""
