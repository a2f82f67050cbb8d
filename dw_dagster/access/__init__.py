"""Access requests: dry-run what a warehouse grant really opens, a time-bound grant every affected
domain's owners approve, and a revoke at its expiry that happens once and is verified on the engine.

- :mod:`.engines` — PostgreSQL (role closure from ``pg_auth_members``, ACLs, default privileges)
  and Snowflake (``SHOW GRANTS``, role inheritance): the dry-run, the grant, the verified revoke;
- :mod:`.dry_run` — who owns what the grant opens, its sensitive columns, what reads them;
- :mod:`.request` — the verified requester, the request, one change set per domain to approve;
- :mod:`.jobs` — the grant and revoke jobs (tickets only), the incident of a failed revoke, the receipt;
- :mod:`.sensor` — approvals in, the grant out, the reminder, the revoke at ``expires_at``;
- :mod:`.notify` — reminders by email and Slack; :mod:`.definitions` — all of it on a code location.
"""

from dw_dagster.access.definitions import build_access_definitions
from dw_dagster.access.jobs import build_access_jobs, resolve_database
from dw_dagster.access.models import AccessError, AccessRequest, AccessSpec
from dw_dagster.access.notify import EmailNotifier, SlackNotifier
from dw_dagster.access.request import (access_asset_spec, confirm, open_database, prepare, request_access, request_nonce,
                                       requester_identity, submit)
from dw_dagster.access.sensor import build_access_sensor

__all__ = ["AccessError", "AccessRequest", "AccessSpec", "EmailNotifier", "SlackNotifier", "access_asset_spec",
           "build_access_definitions", "build_access_jobs", "build_access_sensor", "confirm", "open_database", "prepare",
           "request_access", "request_nonce", "requester_identity", "resolve_database", "submit"]
