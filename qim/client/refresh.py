"""The SDK's side of refresh tokens (spec 15.3.1): exchange over the HTTP auth API, never the
realtime link, keep the rotated refresh token, and hand the new access token to ``reauth``.

``QimClient.refresher`` set to a :class:`TokenRefresher` makes a request answered
``ERROR{TOKEN_EXPIRED}`` renew the session silently (AUTH on the same connection) and go out
once more; a refused refresh (revoked, reused, expired) surfaces as :class:`RefreshRefused`, the
point where an app shows its login screen and keeps its local data.
"""

from __future__ import annotations

import aiohttp

__all__ = ["RefreshRefused", "TokenRefresher"]


class RefreshRefused(Exception):
    """The auth API refused the refresh token: ``code`` is its answer (TOKEN_REVOKED, ...)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"refresh refused ({status} {code}: {detail})")
        self.status, self.code, self.detail = status, code, detail


class TokenRefresher:
    """Holds the current refresh token; :meth:`refresh` rotates it and returns an access token."""

    def __init__(self, auth_url: str, refresh_token: str, *, timeout_s: float = 10.0) -> None:
        self._url = auth_url.rstrip("/") + "/v1/token/refresh"
        self.refresh_token = refresh_token
        self.access_token: str | None = None
        self.expires_at_ms: int | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def refresh(self) -> str:
        async with (
            aiohttp.ClientSession(timeout=self._timeout) as http,
            http.post(self._url, json={"refresh_token": self.refresh_token}) as response,
        ):
            body = await response.json(content_type=None)
            if response.status != 200 or not isinstance(body, dict):
                error = body if isinstance(body, dict) else {}
                raise RefreshRefused(
                    response.status, str(error.get("error", "")), str(error.get("detail", ""))
                )
        self.refresh_token = str(body["refresh_token"])
        self.access_token = str(body["access_token"])
        self.expires_at_ms = int(body["expires_at"])
        return self.access_token
