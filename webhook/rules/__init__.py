"""slurmedic's Prometheus alert rules: rendered from templates and one config file."""
