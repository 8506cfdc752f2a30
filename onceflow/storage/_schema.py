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
    (
        2,
        "boundary: principals, API keys, key quotas, idempotency records",
        """
        CREATE TABLE principals (
            principal_id  uuid PRIMARY KEY,
            tenant        text NOT NULL CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
            name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
            allowed_tools text[] NOT NULL,
            may_decide    boolean NOT NULL DEFAULT false,
            key_quota     integer CHECK (key_quota >= 1),
            created_at    timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT one_principal_name_per_tenant UNIQUE (tenant, name)
        );

        -- Only a digest of each API key is stored; the key itself is shown once.
        CREATE TABLE api_keys (
            key_hash     text PRIMARY KEY CHECK (key_hash ~ '^sha256:[0-9a-f]{64}$'),
            principal_id uuid NOT NULL REFERENCES principals (principal_id) ON DELETE CASCADE,
            key_prefix   text NOT NULL,
            created_at   timestamptz NOT NULL DEFAULT now(),
            revoked_at   timestamptz
        );

        CREATE TABLE principal_key_usage (
            principal_id uuid NOT NULL REFERENCES principals (principal_id) ON DELETE CASCADE,
            window_start timestamptz NOT NULL,
            keys_claimed integer NOT NULL CHECK (keys_claimed >= 1),
            PRIMARY KEY (principal_id, window_start)
        );

        CREATE TABLE idempotency_records (
            scope               text NOT NULL,
            idempotency_key     varchar(200) NOT NULL,
            request_hash        text NOT NULL CHECK (request_hash ~ '^v[0-9]+:[0-9a-f]{64}$'),
            state               text NOT NULL
                                CHECK (state IN ('processing', 'succeeded', 'failed')),
            owner_token         text,
            fencing_token       bigint NOT NULL CHECK (fencing_token >= 1),
            lease_expires_at    timestamptz,
            tenant              text NOT NULL,
            principal_id        uuid NOT NULL REFERENCES principals (principal_id),
            workflow_id         text NOT NULL UNIQUE,
            workflow_run_id     text,
            workflow_started_at timestamptz,
            status_code         integer,
            resource_id         text,
            response_body       jsonb,
            result_retention    interval NOT NULL,
            result_expires_at   timestamptz NOT NULL,
            created_at          timestamptz NOT NULL DEFAULT now(),
            updated_at          timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (scope, idempotency_key),
            CONSTRAINT terminal_records_hold_a_result CHECK (
                state = 'processing' OR (status_code IS NOT NULL AND response_body IS NOT NULL)
            ),
            CONSTRAINT unstarted_claims_hold_a_lease CHECK (
                state <> 'processing' OR workflow_started_at IS NOT NULL
                OR (owner_token IS NOT NULL AND lease_expires_at IS NOT NULL)
            )
        );
        CREATE INDEX idempotency_records_prunable
            ON idempotency_records (result_expires_at) WHERE state <> 'processing';
        """,
    ),
    (
        4,
        "email outbox and deliveries; deployments under a fenced lease",
        """
        -- The business change that asks for an email; its outbox row commits with it.
        CREATE TABLE email_messages (
            event_id    text PRIMARY KEY,
            message_id  text NOT NULL UNIQUE,
            tenant      text NOT NULL,
            workflow_id text NOT NULL,
            step_id     text NOT NULL,
            sender      text NOT NULL,
            recipients  text[] NOT NULL CHECK (cardinality(recipients) >= 1),
            subject     text NOT NULL,
            body        text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now()
        );

        -- One row per email. Only the workflow's attempts arm it (arming + 1); a relay
        -- claims an armed row under a lease and records one classified outcome.
        CREATE TABLE email_outbox (
            event_id         text PRIMARY KEY REFERENCES email_messages (event_id),
            state            text NOT NULL CHECK (state IN
                             ('pending', 'sending', 'delivered', 'rejected', 'transient',
                              'unknown')),
            arming           integer NOT NULL DEFAULT 1 CHECK (arming >= 1),
            armed_by_attempt integer NOT NULL CHECK (armed_by_attempt >= 1),
            armed_at         timestamptz NOT NULL DEFAULT now(),
            claim_token      bigint NOT NULL DEFAULT 0 CHECK (claim_token >= 0),
            claimed_by       text,
            claim_expires_at timestamptz,
            reason           text,
            smtp_reply       text,
            delivered_at     timestamptz,
            updated_at       timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT sending_rows_hold_a_claim CHECK (
                state <> 'sending' OR (claimed_by IS NOT NULL AND claim_expires_at IS NOT NULL)
            )
        );
        CREATE INDEX email_outbox_deliverable
            ON email_outbox (armed_at) WHERE state IN ('pending', 'sending');

        -- Every delivery a relay started, finished or not (a killed relay leaves NULLs).
        CREATE TABLE email_deliveries (
            delivery_id bigserial PRIMARY KEY,
            event_id    text NOT NULL REFERENCES email_outbox (event_id),
            arming      integer NOT NULL,
            claim_token bigint NOT NULL,
            relay_id    text NOT NULL,
            took_over   boolean NOT NULL,
            outcome     text CHECK (outcome IN ('delivered', 'rejected', 'transient', 'unknown')),
            reason      text,
            smtp_reply  text,
            started_at  timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz
        );
        CREATE INDEX email_deliveries_by_event ON email_deliveries (event_id, delivery_id);

        -- One row per deployment; every write after the lease was taken checks the token.
        CREATE TABLE deployments (
            deployment_id    text PRIMARY KEY,
            tenant           text NOT NULL,
            workflow_id      text NOT NULL,
            step_id          text NOT NULL,
            service          text NOT NULL,
            version          text NOT NULL,
            environment      text NOT NULL,
            state            text NOT NULL CHECK (state IN ('running', 'succeeded', 'failed')),
            fencing_token    bigint NOT NULL CHECK (fencing_token >= 1),
            owner            text NOT NULL,
            lease_expires_at timestamptz NOT NULL,
            steps_done       integer NOT NULL DEFAULT 0 CHECK (steps_done >= 0),
            last_report      text,
            created_at       timestamptz NOT NULL DEFAULT now(),
            updated_at       timestamptz NOT NULL DEFAULT now(),
            finished_at      timestamptz
        );
        """,
    ),
    (
        5,
        "custom tools: provider correlation ids of each child operation",
        """
        -- Ids a custom tool learns from its provider (request ids, resource ids), merged
        -- attempt by attempt, so a lookup or an operator can find the effect later.
        ALTER TABLE operations ADD COLUMN correlation jsonb NOT NULL DEFAULT '{}'::jsonb
            CHECK (jsonb_typeof(correlation) = 'object');
        """,
    ),
    (
        6,
        "custom tools: a fenced lease on a child operation",
        """
        -- A custom tool's long child operation may be held by one attempt at a time; each
        -- take-over raises the token, which the far side checks on every write.
        ALTER TABLE operations
            ADD COLUMN fencing_token    bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
            ADD COLUMN lease_owner      text,
            ADD COLUMN lease_expires_at timestamptz,
            ADD CONSTRAINT a_lease_has_an_owner_and_an_expiry
                CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL));
        """,
    ),
    (
        7,
        "deployments: the lease and its fencing token move to the operation record",
        """
        -- start_deployment holds the tool API's fenced lease on its operation record; the
        -- deployments row keeps the business state and the token and owner of its last
        -- write. Deployments already under way carry their tokens over, so the target
        -- keeps refusing their former owners.
        ALTER TABLE deployments ALTER COLUMN lease_expires_at DROP NOT NULL;
        COMMENT ON COLUMN deployments.lease_expires_at IS
            'Before migration 7 only: the lease now lives on the operations row';
        -- Every tool records its provider request ids among the correlation ids now.
        COMMENT ON COLUMN operations.provider_request_id IS
            'Before migration 7 only: request ids are in correlation (request_id)';
        INSERT INTO operations
            (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id,
             result, correlation, fencing_token, lease_owner, lease_expires_at)
        SELECT deployment_id, tenant, workflow_id, step_id, 'start_deployment', 'deploy',
               CASE state WHEN 'running' THEN 'started' ELSE state END,
               CASE state WHEN 'succeeded' THEN deployment_id END,
               CASE state
                   WHEN 'succeeded' THEN jsonb_build_object(
                       'deployment_id', deployment_id, 'service', service,
                       'version', version, 'environment', environment,
                       'fencing_token', fencing_token,
                       'steps', '["prepare", "roll_out", "verify", "activate"]'::jsonb,
                       'replayed', false)
                   WHEN 'failed' THEN jsonb_build_object('reason', last_report)
                   ELSE '{}'::jsonb
               END,
               jsonb_build_object(
                   'deployment_id', deployment_id, 'fencing_token', fencing_token::text,
                   'steps_done', steps_done || '/4', 'lease_owner', owner),
               fencing_token,
               CASE state WHEN 'running' THEN owner END,
               CASE state WHEN 'running' THEN lease_expires_at END
        FROM deployments
        ON CONFLICT (child_key) DO NOTHING;
        """,
    ),
    (
        8,
        "email: a delivery records when its message is about to be sent",
        """
        -- When the relay began sending the message: committed under its live claim after
        -- the server's 354, before the message goes out; NULL while nothing can have been
        -- sent. A relay taking over an expired claim parks the email (unknown) when a
        -- delivery of its arming has this set and no outcome: it may have passed DATA.
        -- Relays insert NULL explicitly; deliveries unfinished now, and the default for
        -- relays older than this migration, count as possibly sent.
        ALTER TABLE email_deliveries ADD COLUMN message_sent_at timestamptz;
        UPDATE email_deliveries SET message_sent_at = started_at WHERE outcome IS NULL;
        ALTER TABLE email_deliveries ALTER COLUMN message_sent_at SET DEFAULT now();
        """,
    ),
    (
        9,
        "email: the trace context of the attempt that armed an email",
        """
        -- The W3C trace context of the send_email attempt that armed the row (set again
        -- when a later attempt re-arms it): the relay's delivery span continues that
        -- trace, so a task's trace holds its SMTP delivery. Ids and flags, never a
        -- secret; relays validate it when they read it and ignore a malformed value.
        -- NULL for rows armed before this migration or outside a trace: they deliver
        -- in a trace of their own.
        ALTER TABLE email_outbox
            ADD COLUMN traceparent text,
            ADD COLUMN tracestate  text;
        """,
    ),
    (
        10,
        "boundary: a sharded key quota and a one-statement claim",
        """
        -- A principal's count of new idempotency keys per quota window, in shards: shard s
        -- of a window may count up to quota / 16, plus one when s < quota % 16, so the
        -- shards together admit exactly the quota and never more. A claim counts in an
        -- unlocked shard with room (its hashed one first), so concurrent claims of one
        -- principal no longer queue on one row lock. Gateways older than this migration
        -- keep counting in principal_key_usage until they are replaced: during that
        -- rollout each version enforces the quota on its own count.
        CREATE TABLE principal_key_usage_shards (
            principal_id uuid NOT NULL REFERENCES principals (principal_id) ON DELETE CASCADE,
            window_start timestamptz NOT NULL,
            shard        smallint NOT NULL CHECK (shard BETWEEN 0 AND 15),
            keys_claimed integer NOT NULL CHECK (keys_claimed >= 0),
            PRIMARY KEY (principal_id, window_start, shard)
        );

        -- Claim (scope, key) in one statement, its own transaction: insert the record
        -- and count it in the principal's window, or return the record that holds the
        -- key (a replay never counts). Over quota it raises SQLSTATE OF429 (the seconds
        -- left in the window as its detail), which undoes the insert: an over-quota
        -- request reserves nothing. No row at all: the holder was pruned or released
        -- between the insert and the read; the caller claims again.
        CREATE FUNCTION claim_idempotency_key(
            p_scope text, p_key text, p_request_hash text, p_owner_token text,
            p_lease interval, p_tenant text, p_principal_id uuid, p_workflow_id text,
            p_result_retention interval, p_quota integer, p_window integer
        ) RETURNS TABLE (
            claimed boolean, scope text, idempotency_key varchar, request_hash text,
            state text, owner_token text, fencing_token bigint,
            lease_expires_at timestamptz, tenant text, principal_id uuid, workflow_id text,
            workflow_run_id text, workflow_started_at timestamptz, status_code integer,
            resource_id text, response_body jsonb, result_expires_at timestamptz,
            created_at timestamptz, read_at timestamptz
        ) LANGUAGE plpgsql AS $claim$
        #variable_conflict use_column
        DECLARE
            v_shards CONSTANT integer := 16;
            v_used integer := least(v_shards, p_quota);
            v_first integer := (hashtext(p_key) & 2147483647) % v_used;
            v_window timestamptz := to_timestamp(
                floor(extract(epoch FROM statement_timestamp()) / p_window) * p_window);
            v_shard integer;
        BEGIN
            RETURN QUERY
            INSERT INTO idempotency_records AS r (
                scope, idempotency_key, request_hash, state, owner_token, fencing_token,
                lease_expires_at, tenant, principal_id, workflow_id, result_retention,
                result_expires_at
            ) VALUES (
                p_scope, p_key, p_request_hash, 'processing', p_owner_token, 1,
                statement_timestamp() + p_lease, p_tenant, p_principal_id, p_workflow_id,
                p_result_retention, statement_timestamp() + p_result_retention
            )
            -- No conflict target: the workflow id is derived from (scope, key) and unique
            -- too, and two concurrent claims of one key can collide on that index first;
            -- with only the (scope, key) arbiter the loser raised a unique violation (a
            -- 500) instead of finding the winner's record. Found by the chaos run.
            ON CONFLICT DO NOTHING
            RETURNING true, r.scope, r.idempotency_key, r.request_hash, r.state,
                r.owner_token, r.fencing_token, r.lease_expires_at, r.tenant,
                r.principal_id, r.workflow_id, r.workflow_run_id, r.workflow_started_at,
                r.status_code, r.resource_id, r.response_body, r.result_expires_at,
                r.created_at, statement_timestamp();
            IF NOT FOUND THEN
                -- A statement of its own, so a new snapshot: it sees the record that won
                -- the conflict (none if that one was pruned or released meanwhile).
                RETURN QUERY
                SELECT false, r.scope, r.idempotency_key, r.request_hash, r.state,
                    r.owner_token, r.fencing_token, r.lease_expires_at, r.tenant,
                    r.principal_id, r.workflow_id, r.workflow_run_id, r.workflow_started_at,
                    r.status_code, r.resource_id, r.response_body, r.result_expires_at,
                    r.created_at, statement_timestamp()
                FROM idempotency_records r
                WHERE r.scope = p_scope AND r.idempotency_key = p_key;
                RETURN;
            END IF;
            FOR v_attempt IN 1..2 LOOP
                -- A shard with room that no other claim holds, the hashed one first.
                SELECT u.shard INTO v_shard FROM principal_key_usage_shards u
                WHERE u.principal_id = p_principal_id AND u.window_start = v_window
                  AND u.keys_claimed < p_quota / v_shards
                      + CASE WHEN u.shard < p_quota % v_shards THEN 1 ELSE 0 END
                ORDER BY (u.shard - v_first + v_used) % v_used
                LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    UPDATE principal_key_usage_shards u SET keys_claimed = u.keys_claimed + 1
                    WHERE u.principal_id = p_principal_id AND u.window_start = v_window
                      AND u.shard = v_shard;
                    RETURN;
                END IF;
                EXIT WHEN v_attempt = 2;
                -- The window's first claim creates its shards (only those that may count).
                INSERT INTO principal_key_usage_shards (principal_id, window_start, shard,
                    keys_claimed)
                SELECT p_principal_id, v_window, n, 0 FROM generate_series(0, v_used - 1) n
                ON CONFLICT DO NOTHING;
            END LOOP;
            -- Every shard is full or held by another claim: wait for each in turn (always
            -- in shard order, so two waiting claims never deadlock) and take the first
            -- with room. Only when all are full is the quota spent.
            FOR v_next IN 0..v_used - 1 LOOP
                UPDATE principal_key_usage_shards u SET keys_claimed = u.keys_claimed + 1
                WHERE u.principal_id = p_principal_id AND u.window_start = v_window
                  AND u.shard = v_next
                  AND u.keys_claimed < p_quota / v_shards
                      + CASE WHEN v_next < p_quota % v_shards THEN 1 ELSE 0 END;
                IF FOUND THEN
                    RETURN;
                END IF;
            END LOOP;
            RAISE EXCEPTION 'the principal''s key quota for this window is spent'
                USING ERRCODE = 'OF429', DETAIL = ceil(
                    p_window - mod(extract(epoch FROM statement_timestamp()), p_window)
                )::integer::text;
        END
        $claim$;
        """,
    ),
    (
        11,
        "boundary: a change to a principal or an API key notifies the gateways' caches",
        """
        CREATE FUNCTION onceflow_principals_changed() RETURNS trigger
        LANGUAGE plpgsql AS $notify$
        BEGIN
            PERFORM pg_notify('onceflow_principals', '');
            RETURN NULL;
        END
        $notify$;

        CREATE TRIGGER api_keys_changed AFTER UPDATE OR DELETE OR TRUNCATE ON api_keys
            FOR EACH STATEMENT EXECUTE FUNCTION onceflow_principals_changed();
        CREATE TRIGGER principals_changed AFTER UPDATE OR DELETE OR TRUNCATE ON principals
            FOR EACH STATEMENT EXECUTE FUNCTION onceflow_principals_changed();
        """,
    ),
    (
        12,
        "boundary: principals that may approve steps without reconciling them",
        """
        -- An app's approval screen answers steps awaiting approval; reconciling a parked
        -- step (an effect that may exist) stays with operators (may_decide). The update
        -- trigger of migration 11 already tells the gateways' caches of a change to it.
        ALTER TABLE principals ADD COLUMN may_approve boolean NOT NULL DEFAULT false;
        """,
    ),
    (
        13,
        "boundary: the request fingerprint's check without a 64-fold repetition",
        """
        -- Migration 2's rule, v<digits>:<64 lowercase hex digits>, checked without a
        -- regular expression that repeats a class 64 times: PostgreSQL builds such a
        -- repetition's matching states anew on every match, a quarter of a record's
        -- insert (bench/claim_cost_split.py). Only the colon after the version can be the
        -- first one, so what follows it has exactly 64 characters.
        ALTER TABLE idempotency_records
            DROP CONSTRAINT idempotency_records_request_hash_check,
            ADD CONSTRAINT request_hash_is_a_versioned_digest CHECK (
                request_hash ~ '^v[0-9]+:[0-9a-f]*$'
                AND length(request_hash) - strpos(request_hash, ':') = 64
            );
        """,
    ),
    (
        14,
        "intents: one business intent, one effect, across tasks, surfaces and processes",
        """
        -- One row per intent (a tool's identifying arguments in a tenant): the step that
        -- holds it. Of any number of calls of one intent, only the holder sends; another
        -- takes it over only once the holder's attempts all ended without effect, or its
        -- window passed (tools/_intent_claims.py).
        CREATE TABLE intents (
            tenant        text NOT NULL,
            tool          text NOT NULL,
            intent_digest text NOT NULL CHECK (intent_digest ~ '^sha256:[0-9a-f]{64}$'),
            workflow_id   text NOT NULL,
            step_id       text NOT NULL,
            state         text NOT NULL
                          CHECK (state IN ('running', 'unknown', 'succeeded', 'no_effect')),
            maybe_effect  boolean NOT NULL DEFAULT false,
            resource_id   text,
            result        jsonb,
            claimed_at    timestamptz NOT NULL DEFAULT now(),
            expires_at    timestamptz NOT NULL,
            PRIMARY KEY (tenant, tool, intent_digest),
            -- A free intent was never one whose effect may exist.
            CHECK (state <> 'no_effect' OR NOT maybe_effect)
        );
        -- A second identical effect made on purpose, with the step that made it.
        CREATE TABLE intent_deliberate_repeats (
            tenant        text NOT NULL,
            tool          text NOT NULL,
            intent_digest text NOT NULL,
            workflow_id   text NOT NULL,
            step_id       text NOT NULL,
            recorded_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workflow_id, step_id)
        );
        """,
    ),
    (
        15,
        "boundary: MCP task handles (the tasks extension) of calls still waiting",
        """
        -- A 2026-07-28 MCP client that declared the tasks extension gets a task handle for
        -- a call that did not end within a short wait: an unguessable id naming the call's
        -- task and step, the principal's only (every tasks/* request checks it), kept
        -- until expires_at (pushed on while the call has not ended). The call's state
        -- stays in Temporal; this row holds the id and what tasks/cancel did with it. One
        -- handle per principal and call, so a re-issued call gets the same task id.
        CREATE TABLE mcp_task_handles (
            task_id             text PRIMARY KEY,
            tenant              text NOT NULL,
            principal_id        uuid NOT NULL
                REFERENCES principals (principal_id) ON DELETE CASCADE,
            workflow_id         text NOT NULL,
            step_id             text NOT NULL,
            tool                text NOT NULL,
            created_at          timestamptz NOT NULL DEFAULT now(),
            expires_at          timestamptz NOT NULL,
            cancel_requested_at timestamptz,
            cancel_outcome      text
                CHECK (cancel_outcome IN ('withdrawn', 'not_undone', 'already_ended')),
            UNIQUE (principal_id, workflow_id, step_id)
        );
        CREATE INDEX mcp_task_handles_by_expiry ON mcp_task_handles (expires_at);
        """,
    ),
    (
        16,
        "providers: the fleet-wide retry budget and pause switch of each provider",
        """
        -- One row per provider its tools reach (onceflow.tools.Provider), shared by every
        -- worker: the retry bucket's tokens (as of refilled_at: it refills with time),
        -- since when it fails, until when it said "not now" (429), an operator's pause. Changed
        -- under the row's lock by tools/_provider_budgets.py; a first attempt only reads.
        CREATE TABLE provider_budgets (
            provider      text PRIMARY KEY CHECK (provider ~ '^[A-Za-z0-9_-]{1,100}$'),
            tokens        double precision NOT NULL CHECK (tokens >= 0),
            refilled_at   timestamptz,
            failing_since timestamptz,
            hold_until    timestamptz,
            paused_at     timestamptz,
            paused_by     text,
            pause_reason  text,
            updated_at    timestamptz NOT NULL DEFAULT now(),
            -- A pause names who and why, or there is none.
            CHECK ((paused_at IS NULL) = (paused_by IS NULL)
                   AND (paused_at IS NULL) = (pause_reason IS NULL))
        );
        -- Every pause and resume: who, when, why. Kept: it is the audit.
        CREATE TABLE provider_pauses (
            id       bigserial PRIMARY KEY,
            provider text NOT NULL,
            action   text NOT NULL CHECK (action IN ('pause', 'resume')),
            operator text NOT NULL CHECK (operator <> ''),
            reason   text NOT NULL CHECK (reason <> ''),
            at       timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    (
        17,
        "boundary: the key quota counted on the record, in a slot of its window",
        """
        -- A new key counts against its principal's quota by the slot its record takes in
        -- the window: 0 <= quota_slot < the quota, and this unique index lets one record
        -- hold each slot of a principal's window, so the database admits at most the
        -- quota of new keys per window, and the claim writes one row instead of two
        -- (bench/claim_cost_split.py). The window is named by its end, so a prune pass
        -- can leave a record whose window is still open (pruning it would free its slot
        -- for another key in that window). A released claim (it started nothing) frees its
        -- slot with its record. Records claimed before this migration hold no slot and
        -- count in no window: in the window during which it is applied, keys counted in
        -- principal_key_usage_shards before it are not seen, so that one window may admit
        -- up to the quota more.
        --
        -- principal_key_usage_shards is no longer written (only pruned of the windows
        -- counted before this migration); a later release may drop it, and with it
        -- principal_key_usage, once no gateway older than this migration can run.
        ALTER TABLE idempotency_records
            ADD COLUMN quota_window_ends_at timestamptz,
            ADD COLUMN quota_slot           integer CHECK (quota_slot >= 0),
            ADD CONSTRAINT a_quota_slot_has_a_window
                CHECK ((quota_slot IS NULL) = (quota_window_ends_at IS NULL));
        CREATE UNIQUE INDEX one_record_per_quota_slot
            ON idempotency_records (principal_id, quota_window_ends_at, quota_slot)
            WHERE quota_slot IS NOT NULL;

        -- The first slot in [p_from, p_below) of a principal's window that no record
        -- holds, or NULL: its run of taken slots read in order from the index, so a
        -- sparse window costs one probe. STABLE: it reads the caller's snapshot, so two
        -- calls in one expression see one state of the window.
        CREATE FUNCTION free_quota_slot(
            p_principal_id uuid, p_window_ends_at timestamptz, p_from integer,
            p_below integer
        ) RETURNS integer LANGUAGE sql STABLE AS $free$
            SELECT CASE
                WHEN p_from >= p_below THEN NULL
                WHEN NOT EXISTS (
                    SELECT FROM idempotency_records r
                    WHERE r.principal_id = p_principal_id
                      AND r.quota_window_ends_at = p_window_ends_at
                      AND r.quota_slot = p_from
                ) THEN p_from
                -- p_from is taken: the slot after the end of its run.
                ELSE (
                    SELECT nullif(run.slot + 1, p_below) FROM (
                        SELECT r.quota_slot AS slot,
                               lead(r.quota_slot) OVER (ORDER BY r.quota_slot) AS next_slot
                        FROM idempotency_records r
                        WHERE r.principal_id = p_principal_id
                          AND r.quota_window_ends_at = p_window_ends_at
                          AND r.quota_slot >= p_from AND r.quota_slot < p_below
                    ) run
                    WHERE run.next_slot IS DISTINCT FROM run.slot + 1
                    ORDER BY run.slot
                    LIMIT 1
                )
            END
        $free$;

        -- Migration 10's claim, with the same arguments and result, so gateways of the
        -- release before keep calling it during a rolling upgrade. The key is counted by
        -- the slot its record takes: the one its workflow id hashes to (so concurrent
        -- claims of one principal spread over the window), or, when another record holds
        -- that one, the next free slot after it, wrapping. Only when no slot is free is
        -- the quota spent. A replay never counts: the key's record is returned, slot or
        -- not. A claim waits for another only when both insert one slot (or one key) at
        -- once, until the other commits.
        CREATE OR REPLACE FUNCTION claim_idempotency_key(
            p_scope text, p_key text, p_request_hash text, p_owner_token text,
            p_lease interval, p_tenant text, p_principal_id uuid, p_workflow_id text,
            p_result_retention interval, p_quota integer, p_window integer
        ) RETURNS TABLE (
            claimed boolean, scope text, idempotency_key varchar, request_hash text,
            state text, owner_token text, fencing_token bigint,
            lease_expires_at timestamptz, tenant text, principal_id uuid, workflow_id text,
            workflow_run_id text, workflow_started_at timestamptz, status_code integer,
            resource_id text, response_body jsonb, result_expires_at timestamptz,
            created_at timestamptz, read_at timestamptz
        ) LANGUAGE plpgsql AS $claim$
        #variable_conflict use_column
        DECLARE
            v_window_ends_at timestamptz := to_timestamp(
                (floor(extract(epoch FROM statement_timestamp()) / p_window) + 1) * p_window);
            v_slot integer := (hashtext(p_workflow_id) & 2147483647) % p_quota;
        BEGIN
            -- Each pass that inserts nothing and finds no record of the key met a slot
            -- another claim took since the last look (or the key's record, gone again):
            -- at most the quota of them, then the caller claims again.
            FOR v_attempt IN 0..p_quota LOOP
                RETURN QUERY
                INSERT INTO idempotency_records AS r (
                    scope, idempotency_key, request_hash, state, owner_token, fencing_token,
                    lease_expires_at, tenant, principal_id, workflow_id, result_retention,
                    result_expires_at, quota_window_ends_at, quota_slot
                ) VALUES (
                    p_scope, p_key, p_request_hash, 'processing', p_owner_token, 1,
                    statement_timestamp() + p_lease, p_tenant, p_principal_id, p_workflow_id,
                    p_result_retention, statement_timestamp() + p_result_retention,
                    v_window_ends_at, v_slot
                )
                -- No conflict target: the key, its workflow id (migration 10) and the
                -- slot each have their unique index.
                ON CONFLICT DO NOTHING
                RETURNING true, r.scope, r.idempotency_key, r.request_hash, r.state,
                    r.owner_token, r.fencing_token, r.lease_expires_at, r.tenant,
                    r.principal_id, r.workflow_id, r.workflow_run_id, r.workflow_started_at,
                    r.status_code, r.resource_id, r.response_body, r.result_expires_at,
                    r.created_at, statement_timestamp();
                IF FOUND THEN
                    RETURN;
                END IF;
                -- A statement of its own, so a new snapshot: it sees the record that won
                -- the conflict, if the conflict was on the key.
                RETURN QUERY
                SELECT false, r.scope, r.idempotency_key, r.request_hash, r.state,
                    r.owner_token, r.fencing_token, r.lease_expires_at, r.tenant,
                    r.principal_id, r.workflow_id, r.workflow_run_id, r.workflow_started_at,
                    r.status_code, r.resource_id, r.response_body, r.result_expires_at,
                    r.created_at, statement_timestamp()
                FROM idempotency_records r
                WHERE r.scope = p_scope AND r.idempotency_key = p_key;
                IF FOUND THEN
                    RETURN;
                END IF;
                -- The slot is taken: the next free one, wrapping, read in one snapshot.
                v_slot := coalesce(
                    free_quota_slot(p_principal_id, v_window_ends_at, v_slot, p_quota),
                    free_quota_slot(p_principal_id, v_window_ends_at, 0, v_slot));
                IF v_slot IS NULL THEN
                    RAISE EXCEPTION 'the principal''s key quota for this window is spent'
                        USING ERRCODE = 'OF429', DETAIL = ceil(
                            p_window - mod(extract(epoch FROM statement_timestamp()), p_window)
                        )::integer::text;
                END IF;
            END LOOP;
        END
        $claim$;
        """,
    ),
)
