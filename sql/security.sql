--
-- Business SQL runs with the caller's privileges; the storage is reached
-- only through the API; a hostile search_path changes nothing.
--
CREATE ROLE idem_app LOGIN;
CREATE ROLE idem_outsider LOGIN;
CREATE TABLE ledger (id int PRIMARY KEY, amount numeric NOT NULL DEFAULT 0);
INSERT INTO ledger VALUES (1, 0);
CREATE TABLE audit (who name, what text);

-- the documented grants for a consumer role
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO idem_app;
GRANT EXECUTE ON FUNCTION idem_is_processed(text, text, "any") TO idem_app;
-- the privilege to create consumers, here by their first use
GRANT EXECUTE ON FUNCTION idem_consumer_create(text, regrole) TO idem_app;
GRANT SELECT ON ledger TO idem_app;
GRANT INSERT ON audit TO idem_app;

SET ROLE idem_app;
-- no UPDATE on ledger: denied, and the key is not recorded
SELECT idem_apply('sec-1', 'ledger', 'update ledger set amount = amount + $1 where id = 1', ARRAY['5']);
SELECT idem_is_processed('sec-1', 'ledger');
-- the business SQL runs as the caller
SELECT idem_apply('sec-2', 'ledger', 'insert into audit values (current_user, $1)', ARRAY['paid']);
-- the storage itself is out of reach
SELECT count(*) FROM idem_consumer.processed_keys_1;
SELECT count(*) FROM idem_processed_keys;
-- so is forgetting keys
SELECT idem_forget('sec-2', 'ledger');
RESET ROLE;

GRANT UPDATE ON ledger TO idem_app;
SET ROLE idem_app;
SELECT idem_apply('sec-1', 'ledger', 'update ledger set amount = amount + $1 where id = 1', ARRAY['5']);
SELECT idem_apply('sec-1', 'ledger', 'update ledger set amount = amount + $1 where id = 1', ARRAY['5']);
RESET ROLE;
SELECT * FROM ledger;
SELECT * FROM audit;

-- a role without EXECUTE cannot record keys
SET ROLE idem_outsider;
SELECT idem_apply('sec-3', 'ledger', 'select 1');
SELECT idem_is_processed('sec-1', 'ledger');
RESET ROLE;

-- a hostile search_path: objects that shadow every name the extension's
-- own statements use, placed before pg_catalog
CREATE SCHEMA evil;
CREATE TABLE evil.processed_keys (consumer_id int, processed_at int, key text);
CREATE TABLE evil.key_collisions (consumer_id int, processed_at int, key text);
CREATE TABLE evil.consumers (consumer_id int, name text);
CREATE FUNCTION evil.key_hash(int, text) RETURNS int LANGUAGE sql AS 'SELECT 0';
CREATE FUNCTION evil.always_true(int, int) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.always_true(text, text) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.always_true);
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always_true);
GRANT USAGE ON SCHEMA evil TO PUBLIC;
SET search_path = evil, pg_catalog, public;
SELECT 1 = 2 AS shadowed_equality;
SELECT idem_apply('sec-4', 'evil-path', 'update public.ledger set amount = amount + 1 where id = 1');
SELECT idem_apply('sec-4', 'evil-path', 'update public.ledger set amount = amount + 1 where id = 1');
SELECT idem_is_processed('sec-4', 'evil-path'), idem_is_processed('sec-never', 'evil-path');
SELECT idem_forget('sec-never', 'evil-path');
RESET search_path;
SELECT count(*) AS shadow_rows FROM evil.processed_keys;
SELECT amount FROM ledger;
SELECT consumer, key FROM idem_processed_keys WHERE consumer IN ('ledger', 'evil-path') ORDER BY consumer, key;

DROP SCHEMA evil CASCADE;
DROP OWNED BY idem_app;
DROP OWNED BY idem_outsider;
DROP ROLE idem_app;
DROP ROLE idem_outsider;
