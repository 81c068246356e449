-- docs/plproxy/shard.sql -- one shard of the PL/Proxy recipe (README,
-- "Scale-out with PL/Proxy").
--
-- Run it once in every shard database, as a superuser, with the shard's
-- partition number and the number of partitions of the cluster:
--
--   psql -v ON_ERROR_STOP=1 -v partition=0 -v partitions=2 -d shop -f docs/plproxy/shard.sql
--
-- The partition number must be the shard's position in the proxy's cluster
-- definition (docs/plproxy/proxy.sql): p0 is partition 0, and so on.
--
-- A shard holds the orders whose id hashes to it, and the processed keys of
-- the messages that change them: shop.pay() records a key and updates the
-- order in one local transaction, so exactness is that of one server.
-- Every function here runs with the rights of the role PL/Proxy connects as
-- (by default the role that called the proxy function): nothing is
-- SECURITY DEFINER.

CREATE EXTENSION IF NOT EXISTS idem_consumer SCHEMA public;

CREATE SCHEMA shop;

-- The routing hash.  The proxy has the same function and runs every call
-- on partition order_hash(order_id) & (partitions - 1); the CHECK below
-- uses it to refuse an order that belongs to another shard.
CREATE FUNCTION shop.order_hash(order_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.hashint8(order_id);

-- Which partition this database is; one row.
CREATE TABLE shop.shard_info (
    partition integer NOT NULL,
    partitions integer NOT NULL
        CHECK (partitions > 0 AND partitions & (partitions - 1) = 0),
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    CHECK (partition >= 0 AND partition < partitions)
);
INSERT INTO shop.shard_info (partition, partitions) VALUES (:partition, :partitions);

CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    amount_due numeric NOT NULL,
    paid_amount numeric NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'NEW'
);

-- An order routed to the wrong shard fails here instead of being stored
-- where no proxy call will ever find it.
SELECT pg_catalog.format(
    'ALTER TABLE shop.orders ADD CONSTRAINT orders_on_this_shard '
    'CHECK (shop.order_hash(id) & %s = %s)', partitions - 1, partition)
  FROM shop.shard_info
\gexec

-- Refuses a message for an order this shard does not hold.  Without it a
-- misrouted payment, or one that arrives before its order, would record
-- its key and update nothing: the message would be lost.
CREATE FUNCTION shop.require_order(order_id bigint, rows_found bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF rows_found = 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'no_data_found',
            MESSAGE = pg_catalog.format('order %s is not on this shard', order_id),
            DETAIL = pg_catalog.format('This is partition %s of %s.',
                (SELECT partition FROM shop.shard_info),
                (SELECT partitions FROM shop.shard_info)),
            HINT = 'Create the order through the proxy, or check that the proxy lists the shards in partition order.';
    END IF;
END
$$;

-- Creates an order; an order that exists already is left as it is.
CREATE FUNCTION shop.create_order(order_id bigint, amount_due numeric) RETURNS void
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO shop.orders (id, amount_due) VALUES (order_id, amount_due)
    ON CONFLICT (id) DO NOTHING;
END;

-- The business SQL of an order-paid message ($1 amount, $2 order id), for
-- idem_apply and idem_try_apply alike.
CREATE FUNCTION shop.pay_statement() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'with paid as (update shop.orders set paid_amount = paid_amount + $1, status = ''PAID'''
       ' where id = $2 returning id) select shop.require_order($2, count(*)) from paid';

-- Applies one order-paid message: the key and the payment in one statement
-- of this shard.  True when applied, false for a duplicate.
CREATE FUNCTION shop.pay(order_id bigint, key text, amount numeric,
                         event_time timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE sql
RETURN public.idem_apply(key, 'payments', shop.pay_statement(),
                         ARRAY[amount::text, order_id::text], event_time);

-- The same message through the dead-letter queue: a payment of an order
-- this shard does not hold is parked on this shard, not raised.
CREATE FUNCTION shop.try_pay(order_id bigint, key text, amount numeric,
                             event_time timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE sql
RETURN public.idem_try_apply(key, 'payments', shop.pay_statement(),
                             ARRAY[amount::text, order_id::text], event_time)::text;

-- Applies this shard's part of a batch (one element per message) in one
-- transaction and returns the keys that were new.  The proxy's SPLIT sends
-- each shard only the messages of its orders.
CREATE FUNCTION shop.pay_batch(keys text[], order_ids bigint[], amounts numeric[])
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    wanted bigint;
    locked bigint;
BEGIN
    IF pg_catalog.cardinality(keys) <> pg_catalog.cardinality(order_ids)
       OR pg_catalog.cardinality(keys) <> pg_catalog.cardinality(amounts) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'keys, order_ids and amounts must have the same length';
    END IF;
    -- Lock the batch's orders in id order, so that two batches paying the
    -- same orders wait instead of deadlocking, and refuse the whole batch
    -- if one of its orders is not here (its key would be recorded for
    -- nothing otherwise).
    SELECT pg_catalog.count(DISTINCT i) INTO wanted FROM pg_catalog.unnest(order_ids) AS i;
    SELECT pg_catalog.count(*) INTO locked
      FROM (SELECT o.id FROM shop.orders AS o
             WHERE o.id = ANY (order_ids) ORDER BY o.id FOR NO KEY UPDATE) AS l;
    IF locked <> wanted THEN
        PERFORM shop.require_order(
            (SELECT i FROM pg_catalog.unnest(order_ids) AS i
              WHERE NOT EXISTS (SELECT FROM shop.orders AS o WHERE o.id = i) LIMIT 1), 0);
    END IF;
    RETURN QUERY
    WITH msg AS (
        SELECT DISTINCT ON (m.key) m.key, m.order_id, m.amount
          FROM unnest(keys, order_ids, amounts) AS m(key, order_id, amount)
    ),
    new_keys AS (
        SELECT k AS key FROM public.idem_record_batch('payments', keys) AS k
    ),
    paid AS (
        SELECT msg.order_id, pg_catalog.sum(msg.amount) AS amount
          FROM msg JOIN new_keys USING (key)
         GROUP BY msg.order_id
    ),
    upd AS (
        UPDATE shop.orders AS o
           SET paid_amount = o.paid_amount + paid.amount, status = 'PAID'
          FROM paid
         WHERE o.id = paid.order_id
    )
    SELECT new_keys.key FROM new_keys;
END
$$;

-- Which partition this database is, for checking the proxy's wiring.
CREATE FUNCTION shop.shard_info() RETURNS TABLE (shard integer, partitions integer)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT s.partition, s.partitions FROM shop.shard_info AS s;
END;

-- This shard's counters, labelled with its partition number.
CREATE FUNCTION shop.shard_stats()
RETURNS TABLE (shard integer, consumer text, applied bigint, duplicates bigint,
               failed bigint, dead_lettered bigint, latency_max_ms double precision,
               last_applied_at timestamptz, last_duplicate_at timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT i.partition, s.consumer, s.applied, s.duplicates, s.failed, s.dead_lettered,
           s.latency_max_ms, s.last_applied_at, s.last_duplicate_at
      FROM public.idem_stats AS s CROSS JOIN shop.shard_info AS i;
END;

-- This shard's counters in the Prometheus text format, without the
-- database label (the proxy sums a series over the shards, whose databases
-- differ): idem_metrics() gives a role with the privileges of
-- pg_read_all_stats the counters of every database of the server, so the
-- samples of other databases (other shards on the same server) are left
-- out.
CREATE FUNCTION shop.shard_metrics() RETURNS text
LANGUAGE sql
BEGIN ATOMIC
    SELECT pg_catalog.string_agg(
               pg_catalog.regexp_replace(
                   pg_catalog.regexp_replace(l.line, '\{database="(?:[^"\\]|\\.)*"\}', ''),
                   'database="(?:[^"\\]|\\.)*",', ''),
               E'\n' ORDER BY l.n) OPERATOR(pg_catalog.||) E'\n'
      FROM pg_catalog.regexp_split_to_table(pg_catalog.rtrim(public.idem_metrics(), E'\n'), E'\n')
               WITH ORDINALITY AS l(line, n)
     WHERE pg_catalog.substring(l.line, '\{database="((?:[^"\\]|\\.)*)"') IS NULL
        OR pg_catalog.substring(l.line, '\{database="((?:[^"\\]|\\.)*)"') OPERATOR(pg_catalog.=)
           pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.current_database(),
               E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n');
END;

-- This shard's dead letters, labelled with its partition number.
CREATE FUNCTION shop.shard_dead_letters()
RETURNS TABLE (shard integer, id bigint, consumer text, key text, status text,
               sqlstate text, message text, attempts integer,
               first_failed_at timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT i.partition, d.id, d.consumer, d.key, d.status, d.sqlstate, d.message,
           d.attempts, d.first_failed_at
      FROM public.idem_dead_letters AS d CROSS JOIN shop.shard_info AS i
     ORDER BY d.id;
END;

-- Raises unless this database is partition on_shard: a replay or discard
-- aimed at one shard must not run on another.
CREATE FUNCTION shop.require_shard(on_shard integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    here integer := (SELECT partition FROM shop.shard_info);
BEGIN
    IF on_shard IS DISTINCT FROM here THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('this is shard %s, not shard %s', here, on_shard),
            HINT = 'Shards are numbered from 0 to the number of partitions minus 1.';
    END IF;
END
$$;

-- Replays up to max_count pending dead letters of one consumer on this shard.
CREATE FUNCTION shop.dlq_replay(on_shard integer, consumer text, max_count integer)
RETURNS TABLE (shard integer, id bigint, outcome text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shop.require_shard(on_shard);
    RETURN QUERY
    SELECT on_shard, r.id, r.outcome::text
      FROM public.idem_dlq_replay(consumer, max_count) AS r;
END
$$;

-- Discards one dead letter of this shard.
CREATE FUNCTION shop.dlq_discard(on_shard integer, id bigint, reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shop.require_shard(on_shard);
    PERFORM public.idem_dlq_discard(id, reason);
END
$$;

--
-- Re-sharding: moving orders with their keys (README, "Re-sharding").
-- With new_partitions partitions (a multiple of the present number), an
-- order leaves this shard for partition order_hash(id) & (new_partitions - 1)
-- and so does every key of it.  A key names its order: order-paid:<id>:<event>.
--

-- The order a key belongs to, or NULL for a key of another form.
CREATE FUNCTION shop.key_order(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN key ~ '^order-paid:[0-9]{1,18}:'
            THEN pg_catalog.split_part(key, ':', 2)::bigint END;

-- Raises if a key leaving for to_partition has a pending dead letter: the
-- entry cannot move with it, and a replay on this shard after the move
-- would apply a message the new shard may apply too.
CREATE FUNCTION shop.require_no_leaving_dead_letters(new_partitions integer, to_partition integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT pg_catalog.count(*) INTO n
      FROM public.idem_dead_letters AS d
     WHERE d.consumer = 'payments' AND d.status = 'pending'
       AND shop.order_hash(shop.key_order(d.key)) & (new_partitions - 1) = to_partition;
    IF n > 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = pg_catalog.format('%s pending dead letters would leave this shard', n),
            HINT = 'Replay or discard them (shop.dlq_replay, shop.dlq_discard) before moving their orders.';
    END IF;
END
$$;

-- Orders leaving this shard for to_partition.
CREATE FUNCTION shop.leaving_orders(new_partitions integer, to_partition integer)
RETURNS TABLE (id bigint, amount_due numeric, paid_amount numeric, status text)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT o.id, o.amount_due, o.paid_amount, o.status
      FROM shop.orders AS o
     WHERE shop.order_hash(o.id) & (new_partitions - 1) = to_partition
       AND to_partition <> (SELECT i.partition FROM shop.shard_info AS i);
END;

-- Keys leaving this shard for to_partition: those of its leaving orders,
-- and those of orders that exist nowhere yet (parked, then discarded).
CREATE FUNCTION shop.leaving_keys(new_partitions integer, to_partition integer)
RETURNS TABLE (key text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM shop.require_no_leaving_dead_letters(new_partitions, to_partition);
    RETURN QUERY
    SELECT k.key
      FROM public.idem_processed_keys AS k
     WHERE k.consumer = 'payments'
       AND shop.order_hash(shop.key_order(k.key)) & (new_partitions - 1) = to_partition
       AND to_partition <> (SELECT i.partition FROM shop.shard_info AS i);
END
$$;

-- What a new shard receives, by COPY, before shop.import_incoming().
CREATE TABLE shop.incoming_orders (LIKE shop.orders);
CREATE TABLE shop.incoming_keys (key text NOT NULL);

-- Stores the received orders and records the received keys as processed,
-- in one transaction, and empties the two tables.
CREATE FUNCTION shop.import_incoming() RETURNS TABLE (orders bigint, keys bigint)
LANGUAGE plpgsql AS $$
DECLARE
    all_keys text[];
    recorded bigint;
BEGIN
    -- the orders' CHECK refuses an order that does not belong here
    INSERT INTO shop.orders SELECT * FROM shop.incoming_orders;
    GET DIAGNOSTICS orders = ROW_COUNT;
    SELECT COALESCE(pg_catalog.array_agg(k.key), '{}') INTO all_keys
      FROM shop.incoming_keys AS k;
    IF EXISTS (SELECT FROM pg_catalog.unnest(all_keys) AS k(key)
                WHERE shop.order_hash(shop.key_order(k.key)) & (SELECT i.partitions - 1 FROM shop.shard_info AS i)
                      IS DISTINCT FROM (SELECT i.partition FROM shop.shard_info AS i)) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'check_violation',
            MESSAGE = 'a received key belongs to another shard';
    END IF;
    SELECT pg_catalog.count(*) INTO recorded FROM public.idem_record_batch('payments', all_keys);
    keys := pg_catalog.cardinality(all_keys);
    IF recorded <> keys THEN
        RAISE EXCEPTION USING
            ERRCODE = 'unique_violation',
            MESSAGE = pg_catalog.format('%s of the %s received keys were recorded here already', keys - recorded, keys),
            HINT = 'Import each move once.';
    END IF;
    DELETE FROM shop.incoming_orders;
    DELETE FROM shop.incoming_keys;
    RETURN NEXT;
END
$$;

-- Once every new shard has imported what leaves this one: forgets the
-- leaving keys, deletes the leaving orders, and makes this shard one of
-- new_partitions partitions.
CREATE FUNCTION shop.drop_leaving(new_partitions integer) RETURNS TABLE (orders bigint, keys bigint)
LANGUAGE plpgsql AS $$
DECLARE
    here integer := (SELECT i.partition FROM shop.shard_info AS i);
    t integer;
BEGIN
    keys := 0;
    FOR t IN 0 .. new_partitions - 1 LOOP
        CONTINUE WHEN t = here;
        SELECT keys + pg_catalog.count(*) FILTER (WHERE public.idem_forget(l.key, 'payments'))
          INTO keys
          FROM shop.leaving_keys(new_partitions, t) AS l;
    END LOOP;
    DELETE FROM shop.orders AS o WHERE shop.order_hash(o.id) & (new_partitions - 1) <> here;
    GET DIAGNOSTICS orders = ROW_COUNT;
    UPDATE shop.shard_info SET partitions = new_partitions;
    EXECUTE pg_catalog.format(
        'ALTER TABLE shop.orders DROP CONSTRAINT orders_on_this_shard, '
        'ADD CONSTRAINT orders_on_this_shard CHECK (shop.order_hash(id) & %s = %s)',
        new_partitions - 1, here);
    RETURN NEXT;
END
$$;
