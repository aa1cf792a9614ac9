"""Flat combining: one queue per hot key and process, whoever leads serves the requests behind it."""

from ._sync import Combiner, Ticket

__all__ = ["Combiner", "Ticket"]
