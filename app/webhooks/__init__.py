"""Webhooks: a job's status changes POSTed, signed, to a URL its spec (or its key) names.

- urls.py: which URLs may be used (http(s), public addresses unless TRAINHUB_WEBHOOK_ALLOW_PRIVATE).
- signing.py: the per-key secret and the Trainhub-Signature header (and how to verify it).
- registration.py: a key's secret and default URL; the check of a spec's webhook_url.
- outbox.py: the deliveries a database trigger records at each status change (migration 0019),
  claimed, rendered, recorded.
- dispatcher.py: the API process's background task that sends them, with retries.
"""
