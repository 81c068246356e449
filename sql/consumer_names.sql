--
-- Names of new consumers: no control or format characters, no white space
-- at either end, and in Unicode normalization form NFC, so that two
-- consumers never differ by what a terminal or a dashboard does not show.
-- Names that exist keep working.  Case is not folded.
--
CREATE FUNCTION cn_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL;
    RETURN st || ' ' || msg || coalesce(E'\nDETAIL: ' || nullif(det, ''), '');
END $$;

SHOW server_encoding;

-- each refused through idem_apply, with what is wrong and where
SELECT label, cn_error(format('SELECT idem_apply(%L, %L, %L)', 'k', name, 'select 1')) AS result
  FROM (VALUES
    ('trailing space',        E'cn-payments '),
    ('leading space',         E' cn-payments'),
    ('tab',                   E'cn-pay\tments'),
    ('newline',               E'cn-payments\n'),
    ('escape',                E'cn-\x1b[31mpayments'),
    ('delete',                E'cn-payments\x7f'),
    ('C1 control',            E'cn-pay\u0085ments'),
    ('zero-width space',      E'cn-pay\u200bments'),
    ('zero-width joiner',     E'cn-pay\u200dments'),
    ('byte order mark',       E'\ufeffcn-payments'),
    ('right-to-left override', E'cn-\u202epayments'),
    ('soft hyphen',           E'cn-pay\u00adments'),
    ('word joiner',           E'cn-pay\u2060ments'),
    ('tag character',         E'cn-payments\U000e0041'),
    ('no-break space at end', E'cn-payments\u00a0'),
    ('ideographic space first', E'\u3000cn-payments'),
    ('not NFC (e + U+0301)',  E'cn-cafe\u0301'),
    ('not NFC (Angstrom sign)', E'cn-\u212b')
  ) AS t (label, name);

-- every function that creates a consumer refuses them, with 22023
SELECT cn_error($$SELECT idem_try_apply('k', E'cn-x\u200b', 'select 1')$$);
SELECT cn_error($$SELECT idem_record_batch(E'cn-x\u200b', ARRAY['k'])$$);
SELECT cn_error($$SELECT idem_effect_enqueue(E'cn-x\u200b', 'k', '{}')$$);
SELECT cn_error($$SELECT idem_consumer_create(E'cn-x\u200b')$$);
SELECT count(*) AS created FROM idem_consumers WHERE consumer LIKE 'cn-%';

-- accepted: another case, another script that looks alike, inner spaces,
-- precomposed letters, symbols
SELECT name, idem_apply('k', name, 'select 1') AS applied
  FROM (VALUES ('cn-Payments'), ('cn-payments'), (E'cn-p\u0430yments'),
               ('cn-pay ments'), (E'cn-caf\u00e9'), (E'cn-\u00c5'),
               (E'cn-\u6d88\u8d39\u8005'), (E'cn-\U0001F4B3')) AS t (name);
SELECT count(*) AS created FROM idem_consumers WHERE consumer LIKE 'cn-%';

-- a name stored before the rule keeps working for every function
INSERT INTO idem_consumer.consumers (name, owner) VALUES (E'cn-legacy ', current_user::regrole);
SELECT idem_apply('k', E'cn-legacy ', 'select 1');
SELECT idem_apply('k', E'cn-legacy ', 'select 1');
SELECT idem_is_processed('k', E'cn-legacy ');
SELECT idem_set_retention(E'cn-legacy ', '30 days');
SELECT cn_error($$SELECT idem_consumer_create(E'cn-legacy ')$$);
SELECT idem_forget('k', E'cn-legacy ');

DROP FUNCTION cn_error(text);
