/*-------------------------------------------------------------------------
 *
 * consumer_names.c
 *	  Which names a new consumer may have.
 *
 * Consumers are told apart by the bytes of their names, and every view,
 * metric and log line shows those names to people.  Two names that a
 * terminal or a dashboard shows alike would be two consumers side by side,
 * with keys, counters and owners of their own: "payments" and "payments "
 * or "pay<U+200B>ments".  So a new consumer's name is refused (22023) if
 *	- it contains a control character (Unicode category Cc: U+0000 to
 *	  U+001F, U+007F to U+009F), which a terminal may act on;
 *	- it contains a format character (category Cf, Unicode 15.0: the soft
 *	  hyphen, zero-width spaces and joiners, bidirectional controls, the
 *	  byte order mark, tag characters...), which shows as nothing or
 *	  reorders what follows;
 *	- it begins or ends with white space (the White_Space property);
 *	- it is not in normalization form NFC, where the same text has
 *	  another spelling ("e" and U+0301 against U+00E9).
 * Case is not folded: broker names (queues, topics, streams) are
 * case-sensitive, "Payments" and "payments" show differently, and folding
 * depends on a locale.  Letters of other scripts that look alike (Latin
 * "a" and Cyrillic U+0430) are not refused either: they are text a person
 * typed, and telling them apart takes the confusables tables of UTS #39.
 *
 * Only new names are checked; a consumer that exists keeps its name and
 * every function accepts it.  Names are read as Unicode after conversion
 * from the server encoding; in a SQL_ASCII database, whose bytes above
 * 0x7F mean nothing, only the ASCII rules apply (control characters, and
 * spaces at either end).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/consumer_names.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/unicode_norm.h"
#include "mb/pg_wchar.h"

#include "idem_consumer.h"

typedef struct CodepointRange
{
	pg_wchar	first;
	pg_wchar	last;
} CodepointRange;

/* General category Cf, Unicode 15.0 */
static const CodepointRange format_characters[] = {
	{0x00AD, 0x00AD}, {0x0600, 0x0605}, {0x061C, 0x061C}, {0x06DD, 0x06DD},
	{0x070F, 0x070F}, {0x0890, 0x0891}, {0x08E2, 0x08E2}, {0x180E, 0x180E},
	{0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x2064}, {0x2066, 0x206F},
	{0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
	{0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
	{0xE0001, 0xE0001}, {0xE0020, 0xE007F},
};

/* The White_Space property, but for the controls among it */
static const CodepointRange white_space[] = {
	{0x0020, 0x0020}, {0x00A0, 0x00A0}, {0x1680, 0x1680}, {0x2000, 0x200A},
	{0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

static bool
in_ranges(pg_wchar c, const CodepointRange *ranges, int nranges)
{
	for (int i = 0; i < nranges; i++)
		if (c >= ranges[i].first && c <= ranges[i].last)
			return true;
	return false;
}

static inline bool
is_control(pg_wchar c)
{
	return c <= 0x1F || (c >= 0x7F && c <= 0x9F);
}

/*
 * Raises 22023 for a new consumer's name; at is the 1-based position of
 * the character, c the character.
 */
static void
refuse_name(const char *why, int at, pg_wchar c)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid name for a new consumer"),
			 errdetail("Character %d is U+%04X, %s.", at, (unsigned int) c, why),
			 errhint("Names of new consumers may not contain control or format characters, "
					 "begin or end with white space, or be other than Unicode NFC.")));
}

/*
 * Checks the name of a consumer about to be created; raises 22023 if it
 * is not allowed.
 */
void
consumer_name_check_new(const char *name)
{
	int			len = strlen(name);
	const unsigned char *utf8;
	pg_wchar   *chars;
	int			nchars = 0;
	pg_wchar   *normalized;
	bool		is_nfc;

	if (GetDatabaseEncoding() == PG_SQL_ASCII)
	{
		for (int i = 0; i < len; i++)
			if (is_control((unsigned char) name[i]) && (unsigned char) name[i] < 0x80)
				refuse_name("a control character", i + 1, (unsigned char) name[i]);
		if (len > 0 && (name[0] == ' ' || name[len - 1] == ' '))
			refuse_name(name[0] == ' ' ? "white space at the beginning" : "white space at the end",
						name[0] == ' ' ? 1 : len, ' ');
		return;
	}

	utf8 = (const unsigned char *) pg_server_to_any(name, len, PG_UTF8);
	len = strlen((const char *) utf8);
	chars = palloc(sizeof(pg_wchar) * (len + 1));
	for (int i = 0; i < len; i += pg_utf_mblen(&utf8[i]))
		chars[nchars++] = utf8_to_unicode(&utf8[i]);
	chars[nchars] = 0;

	for (int i = 0; i < nchars; i++)
	{
		if (is_control(chars[i]))
			refuse_name("a control character", i + 1, chars[i]);
		if (in_ranges(chars[i], format_characters, lengthof(format_characters)))
			refuse_name("an invisible format character", i + 1, chars[i]);
	}
	if (nchars > 0 && in_ranges(chars[0], white_space, lengthof(white_space)))
		refuse_name("white space at the beginning", 1, chars[0]);
	if (nchars > 0 && in_ranges(chars[nchars - 1], white_space, lengthof(white_space)))
		refuse_name("white space at the end", nchars, chars[nchars - 1]);

	switch (unicode_is_normalized_quickcheck(UNICODE_NFC, chars))
	{
		case UNICODE_NORM_QC_YES:
			is_nfc = true;
			break;
		case UNICODE_NORM_QC_NO:
			is_nfc = false;
			break;
		default:
			normalized = unicode_normalize(UNICODE_NFC, chars);
			if (normalized == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("out of memory")));
			is_nfc = true;
			for (int i = 0; i <= nchars; i++)
				if (normalized[i] != chars[i])
				{
					is_nfc = false;
					break;
				}
			break;
	}
	if (!is_nfc)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid name for a new consumer"),
				 errdetail("The name is not in Unicode normalization form NFC."),
				 errhint("Names of new consumers may not contain control or format characters, "
						 "begin or end with white space, or be other than Unicode NFC; "
						 "normalize(name, NFC) gives the NFC form.")));
}
