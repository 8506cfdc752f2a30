"""ledgerpay: a second payment provider brought to onceflow from outside its repository.

``ledgerpay.service`` is the far side (a local payment service whose idempotency rules
differ from Stripe's: keys kept one hour, no stored 500s, a consistent look-up by
reference), ``ledgerpay.settings`` how the tools reach it, and ``ledgerpay.tools`` the two
onceflow tools, ``ledgerpay_charge`` and ``ledgerpay_refund``, registered through the
``onceflow.tools`` entry point ``ledgerpay``.
"""
