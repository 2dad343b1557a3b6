"""Slack-compatible incoming webhooks as an alert target: ``gpugap notify slack``."""
