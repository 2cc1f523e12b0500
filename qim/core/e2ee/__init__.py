"""E2EE rules the server applies (spec 22): prekey bundles (``prekeys``). The server never
holds a private key and never reads ciphertext; the client side of X3DH / Double Ratchet is the
SDK's (``qim.client.e2ee``)."""
