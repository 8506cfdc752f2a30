"""The database schema as ordered migrations; business invariants live in constraints."""

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "operations, coupons and orders",
        """
        CREATE TABLE operations (
            child_key           text PRIMARY KEY,
            tenant              text NOT NULL,
            workflow_id         text NOT NULL,
            step_id             text NOT NULL,
            tool                text NOT NULL,
            child_op            text NOT NULL,
            state               text NOT NULL CHECK (state IN ('started', 'succeeded', 'failed')),
            resource_id         text,
            provider_request_id text,
            result              jsonb NOT NULL DEFAULT '{}'::jsonb,
            created_at          timestamptz NOT NULL DEFAULT now(),
            updated_at          timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX operations_by_workflow ON operations (workflow_id, step_id);

        CREATE TABLE coupon_issuances (
            issuance_id uuid PRIMARY KEY,
            tenant      text NOT NULL,
            user_id     text NOT NULL,
            coupon_id   text NOT NULL,
            workflow_id text NOT NULL,
            step_id     text NOT NULL,
            issued_at   timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT one_coupon_per_user UNIQUE (tenant, user_id, coupon_id)
        );

        CREATE TABLE orders (
            order_id    uuid PRIMARY KEY,
            tenant      text NOT NULL,
            customer_id text NOT NULL,
            currency    text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
            total_cents bigint NOT NULL CHECK (total_cents >= 0),
            child_key   text NOT NULL UNIQUE REFERENCES operations (child_key),
            created_at  timestamptz NOT NULL DEFAULT now()
        );

        CREATE TABLE order_lines (
            order_id         uuid NOT NULL REFERENCES orders (order_id),
            line_no          integer NOT NULL CHECK (line_no >= 1),
            sku              text NOT NULL,
            quantity         integer NOT NULL CHECK (quantity > 0),
            unit_price_cents bigint NOT NULL CHECK (unit_price_cents >= 0),
            PRIMARY KEY (order_id, line_no)
        );
        """,
    ),
)
