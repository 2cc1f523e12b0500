"""Operator tools over a running installation (audits); at the agents' level of the layers."""
