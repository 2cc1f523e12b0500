"""The NotificationService's pure rules (spec 16): dedup, merge, rate, retry, PD-1, and the
validation of a device-token registration. No I/O; time is an argument."""
