"""User model code (issue 22): a Python file or a small zip a key uploads, checked once, stored
content-addressed, and trained by the worker in a child process of its own.

- `package`: reading an upload (names, sizes, zip bombs) and its entrypoints (`ast`, never run);
- `records`: who may use it (TRAINHUB_ALLOW_USER_CODE and the key's permission), the records,
  and the checks a job naming code gets at submission.
"""
