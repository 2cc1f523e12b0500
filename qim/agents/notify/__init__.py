"""The NotificationService's shells (spec 16): providers, token sealing, the registration API
and the agent bodies the Faust app ``qim.apps.notify`` runs."""
