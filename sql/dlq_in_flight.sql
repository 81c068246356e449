--
-- A replay cannot replay, discard or forget the message it is running, nor
-- replay any entry of its consumer: while business SQL runs, those calls
-- raise 55006 (object_in_use), and the replay fails like any other.
-- Before, a parked message whose stored SQL called idem_dlq_replay of its
-- own entry was applied again by the inner call, recursively, hundreds of
-- times in one operator replay, which then ended "replayed" with 54001
-- stored; a discard of its own entry ended in an internal 23514.
--
CREATE TABLE dif_log (k text NOT NULL);
-- the stored failure of an entry, its number masked
CREATE FUNCTION dif_entry(k text)
RETURNS TABLE (status text, attempts int, sqlstate text, message text, detail text)
LANGUAGE sql AS $$
    SELECT status, attempts, sqlstate,
           regexp_replace(message, 'entry \d+', 'entry N'),
           regexp_replace(detail, 'entry \d+', 'entry N')
      FROM idem_dead_letters WHERE consumer = 'dif' AND key = k
$$;
-- parks a message of consumer dif, then gives its entry the SQL sql, in
-- which %s stands for the entry's id
CREATE FUNCTION dif_park(k text, sql text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_try_apply(k, 'dif', 'insert into dif_log values (1/0)');
    UPDATE idem_consumer.dead_letters d
       SET sql = format(dif_park.sql, v.id)
      FROM idem_dead_letters v
     WHERE v.consumer = 'dif' AND v.key = k AND d.dead_letter_id = v.id;
END $$;

-- a replay of its own entry by id
SELECT dif_park('r1', 'insert into dif_log select ''r1'' from idem_dlq_replay(%s)');
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'dif' AND key = 'r1';
SELECT * FROM dif_entry('r1');
-- a replay of its consumer's entries, under a replay of the consumer's
SELECT dif_park('r2', 'insert into dif_log select ''r2'' from idem_dlq_replay(''dif'')');
SELECT d.outcome, v.key FROM idem_dlq_replay('dif') d JOIN idem_dead_letters v USING (id) ORDER BY v.key;
SELECT * FROM dif_entry('r2');
SELECT count(*) AS applied FROM dif_log;
-- a replay of another entry of the consumer, by id
SELECT dif_park('r3', 'insert into dif_log select ''r3'' from idem_dlq_replay((select id from idem_dead_letters where consumer = ''dif'' and key = ''r1''))');
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'dif' AND key = 'r3';
SELECT * FROM dif_entry('r3');
-- a discard of its own entry
SELECT dif_park('r4', 'select idem_dlq_discard(%s, ''done'')');
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'dif' AND key = 'r4';
SELECT * FROM dif_entry('r4');
-- a forget of its own key
SELECT dif_park('r5', 'select idem_forget(''r5'', ''dif'')');
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'dif' AND key = 'r5';
SELECT * FROM dif_entry('r5');

-- the first delivery's business SQL may not replay an entry of its consumer
-- either: idem_apply raises, idem_try_apply parks the message
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT idem_apply('a1', 'dif', 'select idem_dlq_replay(''dif'')');
SELECT idem_apply('a1', 'dif', format('select idem_dlq_replay(%s)',
    (SELECT id FROM idem_dead_letters WHERE consumer = 'dif' AND key = 'r1')));
SELECT idem_try_apply('a2', 'dif', 'select idem_dlq_replay(''dif'')');
SELECT * FROM dif_entry('a2');
SELECT idem_is_processed('a1', 'dif') AS a1_recorded;
-- nor may the business SQL of an external effect's completion
SELECT action FROM idem_effect_begin('dif', 'e1');
SELECT idem_effect_complete('dif', 'e1', 1, '{}', 'select idem_dlq_replay(''dif'')');
SELECT state FROM idem_effects WHERE consumer = 'dif' AND key = 'e1';

-- outside business SQL the entries replay as usual: each applies once
UPDATE idem_consumer.dead_letters d SET sql = format('insert into dif_log values (%L)', v.key)
  FROM idem_dead_letters v
 WHERE v.consumer = 'dif' AND v.status = 'pending' AND d.dead_letter_id = v.id;
SELECT d.outcome, v.key FROM idem_dlq_replay('dif') d JOIN idem_dead_letters v USING (id) ORDER BY v.key;
SELECT k, count(*) FROM dif_log GROUP BY k ORDER BY k;

DROP FUNCTION dif_park(text, text);
DROP FUNCTION dif_entry(text);
DROP TABLE dif_log;
