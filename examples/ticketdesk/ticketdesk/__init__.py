"""ticketdesk: a help-desk tool brought to onceflow from outside its repository.

``ticketdesk.service`` is the far side (a local help-desk HTTP service with Stripe's
idempotency rules and fault injection), ``ticketdesk.tools`` the two onceflow tools
registered through the ``onceflow.tools`` entry point ``ticketdesk``, and
``ticketdesk.agent`` a minimal agent runtime that retries the way real agents do.
"""
