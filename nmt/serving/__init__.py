"""Serving: what serve.py needs besides its routes (the connection guard, the checks of a request,
LibreTranslate's API)."""
