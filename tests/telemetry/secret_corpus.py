"""The secret filter's corpus: what it must find, and near misses it must let through.

Each case is ``(label, text)``; positives also say what is found. Where a near miss is
only safe because of a rule (its digits pass Luhn), the label says which rule. Credential
shapes are assembled from parts so that secret scanners reading this repository do not
take the fixtures for leaked keys; none of them is a real credential.
"""

# Assembled prefixes: see the module docstring.
STRIPE_LIVE = "sk_" + "live_"
STRIPE_TEST = "sk_" + "test_"
STRIPE_RESTRICTED = "rk_" + "live_"
GITHUB_CLASSIC = "gh" + "p_"
GITHUB_FINE_GRAINED = "github_" + "pat_"
SLACK_BOT = "xo" + "xb-"
SLACK_USER = "xo" + "xp-"
AWS_KEY_ID = "AK" + "IA" + "IOSFODNN7EXAMPLE"
AWS_SESSION_KEY_ID = "AS" + "IA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
GOOGLE_KEY = "AI" + "za" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
OPENAI_KEY = "sk-" + "proj-" + "4fJ8a0bQ2kXzR7mN1pLw9cVt6yH3sD5e"
ANTHROPIC_KEY = "sk-" + "ant-api03-" + "Xb7kq2Lm9Pz4Rw1Nc8Vt5Hs3Jd6Fg0Ay"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"
BEGIN, END = "-----BEGIN", "-----END"

CARD_NUMBER, SECRET = "card number", "secret"

POSITIVES: list[tuple[str, str, str]] = [
    # (label, text, kind found)
    ("visa unseparated", "4242424242424242", CARD_NUMBER),
    ("visa spaces", "4242 4242 4242 4242", CARD_NUMBER),
    ("visa dashes", "4242-4242-4242-4242", CARD_NUMBER),
    ("visa dots", "4242.4242.4242.4242", CARD_NUMBER),
    ("visa underscores", "4242_4242_4242_4242", CARD_NUMBER),
    ("visa colons", "4242:4242:4242:4242", CARD_NUMBER),
    ("card number dressed as a PaymentMethod id", "pm_4242424242424242", CARD_NUMBER),
    ("card number dressed as a card id", "card_4242424242424242", CARD_NUMBER),
    ("card number dressed as a token", "tok_4242-4242-4242-4242", CARD_NUMBER),
    ("visa slashes", "4242/4242/4242/4242", CARD_NUMBER),
    ("visa mixed separators", "4242 4242-4242.4242", CARD_NUMBER),
    ("visa spaced dashes", "4242 - 4242 - 4242 - 4242", CARD_NUMBER),
    ("visa no-break spaces", "4242\u00a04242\u00a04242\u00a04242", CARD_NUMBER),
    ("visa en dashes", "4242\u20134242\u20134242\u20134242", CARD_NUMBER),
    ("visa tabs", "4242\t4242\t4242\t4242", CARD_NUMBER),
    ("visa in pairs", "42 42 42 42 42 42 42 42", CARD_NUMBER),
    ("visa digit by digit", "4 2 4 2 4 2 4 2 4 2 4 2 4 2 4 2", CARD_NUMBER),
    ("visa groups 3-4-5-4", "424 2424 24242 4242", CARD_NUMBER),
    ("visa groups 8-8 dotted", "42424242.42424242", CARD_NUMBER),
    ("visa 13 digits", "4222222222222", CARD_NUMBER),
    ("visa debit in a sentence", "please charge 4000 0566 5566 5556, thanks", CARD_NUMBER),
    ("visa with expiry and cvc", "4242 4242 4242 4242 12/28 123", CARD_NUMBER),
    ("visa labelled with a colon", "card:4242424242424242", CARD_NUMBER),
    ("visa after a hash", "order paid with #4242424242424242", CARD_NUMBER),
    ("visa in json text", '{"number": "4242-4242-4242-4242"}', CARD_NUMBER),
    ("visa after a date", "2026-05-01 4242 4242 4242 4242", CARD_NUMBER),
    ("mastercard spaces", "5555 5555 5555 4444", CARD_NUMBER),
    ("mastercard 2-series dots", "2223.0031.2200.3222", CARD_NUMBER),
    ("amex 4-6-5", "3782 822463 10005", CARD_NUMBER),
    ("amex unseparated", "378282246310005", CARD_NUMBER),
    ("discover slashes", "6011/1111/1111/1117", CARD_NUMBER),
    ("diners 14 digits", "3056 930902 5904", CARD_NUMBER),
    ("jcb underscores", "3566_0020_2036_0505", CARD_NUMBER),
    ("unionpay 19 digits", "6205 5000 0000 0000 004", CARD_NUMBER),
    ("stripe secret key", STRIPE_LIVE + "51H8xYzAbCdEfGhIjKlMnOpQr", SECRET),
    ("stripe test secret key", "key " + STRIPE_TEST + "4eC39HqLyjWDarjtT1zdp7dc", SECRET),
    ("stripe restricted key", STRIPE_RESTRICTED + "51H8xYzRestricted00abc", SECRET),
    ("stripe webhook secret", "whsec_" + "5WbX5kEWLlfzsGNjH64I8lOOqUB6e8FH", SECRET),
    (
        "stripe client secret",
        "pi_3MtwBwLkdIwHu7ix28a3tqPa_secret_YrKJUKribcBjcG8HVhfZluoGH",
        SECRET,
    ),
    ("onceflow api key", "ofk_" + "k3Jd9xQ2-PlanTed7", SECRET),
    ("bearer short token", "Authorization: Bearer abc123xyz", SECRET),
    ("bearer lower-case scheme", "bearer 9f8e7d6c5b4a", SECRET),
    ("bearer mixed-case letters", "Bearer AbCdEfGhIj", SECRET),
    ("aws access key id", AWS_KEY_ID, SECRET),
    ("aws session key id", f"key id {AWS_SESSION_KEY_ID}", SECRET),
    ("aws secret in a config", f"aws_secret_access_key = {AWS_SECRET}", SECRET),
    ("aws secret in sts json", f'"SecretAccessKey": "{AWS_SECRET}"', SECRET),
    (
        "gcp service-account key file",
        '{"type": "service_account", "project_id": "demo", '
        '"private_key_id": "1c6f3b0a9e2d4c5b8a7f6e5d4c3b2a1908f7e6d5"}',
        SECRET,
    ),
    (
        "gcp private key, json-escaped",
        f'"private_key": "{BEGIN} PRIVATE KEY-----\\n{PEM_BODY}\\n{END} PRIVATE KEY-----\\n"',
        SECRET,
    ),
    ("pem rsa private key", f"{BEGIN} RSA PRIVATE KEY-----\n{PEM_BODY}\n{END}", SECRET),
    ("pem openssh private key", f"{BEGIN} OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=", SECRET),
    ("pem ec private key", f"{BEGIN} EC PRIVATE KEY-----\n{PEM_BODY}", SECRET),
    ("jwt", JWT, SECRET),
    ("jwt in a sentence", f"the session is {JWT} until noon", SECRET),
    ("github classic token", GITHUB_CLASSIC + "16C7e42F292c6912E7710c838347Ae178B4a", SECRET),
    (
        "github fine-grained token",
        GITHUB_FINE_GRAINED + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789",
        SECRET,
    ),
    ("slack bot token", SLACK_BOT + "2048-1234567890-AbCdEfGhIjKl", SECRET),
    ("slack user token", SLACK_USER + "2048-1234567890-1234567890-abcdef0123", SECRET),
    (
        "slack webhook",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        SECRET,
    ),
    ("google api key", GOOGLE_KEY, SECRET),
    ("openai key", OPENAI_KEY, SECRET),
    ("anthropic key", ANTHROPIC_KEY, SECRET),
    ("password assignment", "password=hunter2", SECRET),
    ("env password", "DB_PASSWORD=s3cr3t!", SECRET),
    ("yaml password", "password: hunter2", SECRET),
    ("quoted password of letters", "passwd = 'correcthorse'", SECRET),
    ("api key in a url", "https://api.example.com/v1/items?api_key=9d2f1a7c3b&page=2", SECRET),
    ("api key in json text", '{"api_key": "abc123def456"}', SECRET),
    ("x-api-key header", "x-api-key: 8f14e45fceea167a5a36dedd4bea2543", SECRET),
    ("client secret assignment", "client_secret=Zx9-Kq2_Lm8", SECRET),
    ("password in a url", "postgresql://app:Tr0ub4dor3@db.internal:5432/app", SECRET),
    ("basic credential", "Authorization: Basic dXNlcjpwYXNz", SECRET),
]

NEGATIVES: list[tuple[str, str]] = [
    ("order id glued by a dash (Luhn-valid digits)", "ord-4242424242424242"),
    ("order id glued by an underscore (Luhn-valid digits)", "ord_4242424242424242"),
    ("order id glued to letters (Luhn-valid digits)", "ORD4242424242424242"),
    ("id with a suffix (Luhn-valid digits)", "4242424242424242-retry"),
    ("phone, us", "+1 415 555 0100"),
    ("phone, uk", "+44 20 7946 0958"),
    ("phone, china, 13 digits (Luhn-valid, after +)", "+86 138 0013 8002"),
    ("phone, international prefix 00 (Luhn-valid, leading 0)", "0044 20 7946 0907"),
    ("phone, parentheses", "(415) 555-0100"),
    ("phone with extension", "+1-800-555-0199 ext. 1234"),
    ("isbn-13 with dashes", "978-0-306-40615-7"),
    ("isbn-13 (Luhn-valid, 978 prefix)", "978-0-306-40616-4"),
    ("isbn-13 unseparated", "9780306406157"),
    ("isbn-10", "0-306-40615-2"),
    ("iban, germany", "DE89 3704 0044 0532 0130 00"),
    ("iban, uk (Luhn-valid account digits)", "GB72 NWBK 6016 1331 9268 21"),
    ("iban, compact", "DE89370400440532013000"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
    ("uuid with digit-only segments (Luhn-valid)", "12345678-1234-4004-9abc-def012345678"),
    ("nil uuid", "00000000-0000-0000-0000-000000000000"),
    ("sha-256", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
    ("sha-1", "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3"),
    ("key digest", "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"),
    ("trace id", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("idempotency key", "order-7dc3e9c2-0f27-4f8e-9aa1-a4b92d2f7834"),
    ("iso timestamp", "2026-05-01T12:34:56.789Z"),
    ("log timestamp (Luhn-valid digits)", "2026-05-01 12:34:06,789 INFO onceflow.gateway"),
    ("timestamp with microseconds", "2026-05-01 12:34:56.789012"),
    ("epoch milliseconds (Luhn-valid)", "1717171717109"),
    ("epoch microseconds (Luhn-valid)", "1717171717171707"),
    ("epoch seconds", "1717171717"),
    ("amount with decimals", "4242.42"),
    ("amount with thousands", "EUR 1,234,567.89"),
    ("amount in cents", "amount=4200"),
    ("payment intent id", "pi_3MtwBwLkdIwHu7ix28a3tqPa"),
    ("payment method", "pm_card_visa"),
    ("customer id", "cus_NffrFeUfNV2Hib"),
    ("publishable key (public by design)", "pk_" + "live_51H8xYzAbCdEfGhIjKlMnOpQr"),
    ("date with slashes", "2026/12/01"),
    ("date, day first", "01.12.2026"),
    ("date, month first", "12/01/2026"),
    ("ipv4", "192.168.100.200"),
    ("ipv4 with port (Luhn-valid digits)", "192.168.100.200:8002"),
    ("version", "1.2.3"),
    ("version with v", "v2.14.0"),
    ("windows build", "10.0.19045.3693"),
    ("luhn-invalid 16 digits", "4242 4242 4242 4241"),
    ("12 digits", "4242 4242 4242"),
    ("20 digits unseparated", "42424242424242424242"),
    ("bearer in prose", "Bearer instruments are negotiable"),
    ("bearer placeholder", "Authorization: Bearer YOUR_API_KEY"),
    ("basic in prose", "Basic information about the plan"),
    ("password prompt", "password: required"),
    ("empty password", "password="),
    ("masked password", "password=********"),
    ("password placeholder", "api_key=${STRIPE_API_KEY}"),
    ("password reset link", "reset your password at https://example.com/reset"),
    ("url placeholder credentials", "postgresql://user:password@host/db"),
    ("pagination token (token alone is ambiguous)", "next_page_token=CiAKGjBpNDd2"),
    ("kwarg in code", "OnceflowClient(url, api_key=API_KEY)"),
    ("domain name", "www.example.com"),
]
