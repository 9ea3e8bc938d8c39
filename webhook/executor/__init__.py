"""Carrying decisions out: playbooks run by ansible-runner (check mode in monitor mode)."""
