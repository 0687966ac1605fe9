"""PVE's TOTP second factor at login, for fakepve. fakepve asks a TFA user for the second factor (NeedTFA) but refuses
every answer; this completes the step as pve-access-control does (src/PVE/API2/AccessControl.pm, create_ticket):

- the first POST /access/ticket, with the right password, answers a challenge ticket (`PVE:!tfa!...`), the username
  and `NeedTFA: 1`, and no usable ticket;
- the second posts the username, `tfa-challenge` (that ticket) and `password` as `totp:<code>`, and gets a ticket;
- a failure of either step is 401 `authentication failure`, and says nothing more.

The code is checked as PVE's TOTP entries are: RFC 6238 over HMAC-SHA-1, 30 s steps, 6 digits, one step either side
of now. A test tool (fakepve is never imported by product code); its check is written apart from the client's
(plugins/module_utils/pve_api.py totp), so that one cannot agree with itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

STEP_S, DIGITS, WINDOW = 30, 6, 1
CHALLENGE_S = 120  # how long a challenge ticket may be answered


def code_at(secret: str, counter: int) -> str:
    """RFC 6238's code for one time step (RFC 4226 dynamic truncation)."""
    key = base64.b32decode(secret + "=" * (-len(secret) % 8), casefold=True)
    digest = hmac.digest(key, counter.to_bytes(8, "big"), hashlib.sha1)
    start = digest[19] & 0xF
    value = int.from_bytes(digest[start : start + 4], "big") & 0x7FFFFFFF
    return f"{value % 10**DIGITS:0{DIGITS}d}"


def accepts(secret: str, code: str, now: float | None = None) -> bool:
    step = int((time.time() if now is None else now) // STEP_S)
    return any(hmac.compare_digest(code_at(secret, step + d), code) for d in range(-WINDOW, WINDOW + 1))


def totp_pve(base):
    """`base` (FakePve or a subclass) whose users in `totp_secrets` ({user: base32 secret}) log in with a TOTP."""
    from fakepve.model import PveError
    from fakepve.server import ok, params

    class TotpPve(base):
        totp_secrets: dict[str, str]

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.totp_secrets = {}
            self.answers: list[tuple[str, bool]] = []  # (user, accepted) for each second step: PVE counts refusals
            self._challenges: dict[str, tuple[str, float]] = {}

        async def _ticket(self, request):
            p = await params(request)
            user = str(p.get("username", ""))
            user = user if "@" in user else user + "@pam"
            if user not in self.totp_secrets:
                return await super()._ticket(request)
            if p.get("tfa-challenge") is None:
                if not self.check_password(user, p.get("password", "")):
                    raise PveError(401, "authentication failure")
                challenge = f"PVE:!tfa!{secrets.token_hex(16)}"
                self._challenges[challenge] = (user, time.monotonic() + CHALLENGE_S)
                return ok(
                    {"ticket": challenge, "username": user, "NeedTFA": 1, "CSRFPreventionToken": secrets.token_hex(8)}
                )
            pending = self._challenges.get(str(p["tfa-challenge"]))
            kind, _, code = str(p.get("password", "")).partition(":")
            if not pending or pending[0] != user or pending[1] < time.monotonic():
                raise PveError(401, "authentication failure")
            accepted = kind == "totp" and accepts(self.totp_secrets[user], code)
            self.answers.append((user, accepted))
            if not accepted:
                raise PveError(401, "authentication failure")
            ticket, csrf = self.issue_ticket(user)
            return ok({"ticket": ticket, "CSRFPreventionToken": csrf, "username": user, "cap": {}})

    return TotpPve
