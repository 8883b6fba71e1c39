"""Serving: what serve.py needs besides its routes (the connection guard)."""
