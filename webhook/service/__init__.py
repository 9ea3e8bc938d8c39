"""The running service: its configuration, the live loop, the adapters it drives."""
