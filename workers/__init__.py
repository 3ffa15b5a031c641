"""Celery workers: the task, hardware pinning and detection, heartbeats."""
