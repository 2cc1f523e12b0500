"""qim: the Q-IM instant-messaging backend as a Faust pipeline on the Kafka commit log."""

__version__ = "0.1.0"
__all__ = ["__version__"]
