"""Listeners and live connections: WebSocket and TLS/TCP drivers over the sans-I/O Session.

``listeners`` starts them, ``connection`` runs one socket's writer task, ``outbound`` schedules
the A.5 streams, ``sendbuf`` / ``budget`` account the send buffers (11.3.3).
"""
