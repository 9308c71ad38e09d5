/*-------------------------------------------------------------------------
 *
 * cron_parse.c
 *	  The cron engine's parser (see cron.h): five fields or a shorthand,
 *	  into bit masks, with an error that names the field and says why.
 *
 * Like cron.c, this file includes no PostgreSQL header: it is linked both
 * into the module and, on its own, into the libFuzzer target.  Parsing is
 * one pass over at most FS_CRON_MAX_LENGTH bytes.
 *
 *-------------------------------------------------------------------------
 */
#include "schedules/cron.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Bytes of a token quoted in an error message. */
#define QUOTE_MAX			40

static const char *const field_names[FS_CRON_NFIELDS + 1] = {
	"minute", "hour", "day-of-month", "month", "day-of-week", "expression"
};

static const char *const month_names[] = {
	"jan", "feb", "mar", "apr", "may", "jun",
	"jul", "aug", "sep", "oct", "nov", "dec"
};

static const char *const day_names[] = {
	"sun", "mon", "tue", "wed", "thu", "fri", "sat"
};

typedef struct FieldSpec
{
	int			min;			/* smallest value */
	int			max;			/* largest value */
	int			star_max;		/* where * and "N/step" end */
	const char *const *names;	/* three-letter names, or NULL */
	int			nnames;
	int			names_base;		/* value of names[0] */
	const char *name_hint;		/* what to write instead of a bad name */
} FieldSpec;

static const FieldSpec field_specs[FS_CRON_NFIELDS] = {
	{0, 59, 59, NULL, 0, 0, "The minute field takes numbers 0-59 only."},
	{0, 23, 23, NULL, 0, 0, "The hour field takes numbers 0-23 only."},
	{1, 31, 31, NULL, 0, 0, "The day-of-month field takes numbers 1-31 only."},
	{1, 12, 12, month_names, 12, 1,
	"Use month names jan-dec (any case) or numbers 1-12."},
	/* 7 is Sunday as well as 0; * covers one week, 0-6 */
	{0, 7, 6, day_names, 7, 0,
	"Use day names sun-sat (any case) or numbers 0-7 (0 and 7 are Sunday)."}
};

/* The most days month m (1-12) ever has (February: 29). */
static const int max_days_in_month[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

/* The name of a field (FS_CRON_WHOLE: the whole expression), for messages. */
const char *
fs_cron_field_name(int field)
{
	if (field < 0 || field > FS_CRON_WHOLE)
		return "expression";
	return field_names[field];
}

/* ----------------------------------------------------------------
 * Errors
 * ----------------------------------------------------------------
 */

static bool cron_fail(FsCronError *error, FsCronErrorCode code, int field, const char *hint,
					  const char *fmt,...) __attribute__((format(printf, 5, 6)));

/*
 * Fill in `error` (its code, the field it is about, a message made from
 * `fmt` and a hint) and return false: every parse error goes through here.
 */
static bool
cron_fail(FsCronError *error, FsCronErrorCode code, int field, const char *hint,
		  const char *fmt, ...)
{
	va_list		args;

	error->code = code;
	error->field = field;
	va_start(args, fmt);
	vsnprintf(error->detail, sizeof(error->detail), fmt, args);
	va_end(args);
	snprintf(error->hint, sizeof(error->hint), "%s", hint);
	return false;
}

/*
 * Quote a token for a message: at most QUOTE_MAX bytes, with bytes that are
 * not printable ASCII shown as \xNN (the input may be any bytes at all).
 */
static const char *
quote_token(const char *p, size_t len, char *buf, size_t bufsize)
{
	size_t		out = 0;
	size_t		i;

	if (bufsize < 8)
		return "";
	buf[out++] = '"';
	for (i = 0; i < len && i < QUOTE_MAX; i++)
	{
		unsigned char c = (unsigned char) p[i];

		if (out + 8 >= bufsize)
			break;
		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
			buf[out++] = (char) c;
		else
			out += (size_t) snprintf(buf + out, bufsize - out, "\\x%02X", c);
	}
	if (i < len && out + 5 < bufsize)
	{
		memcpy(buf + out, "...", 3);
		out += 3;
	}
	buf[out++] = '"';
	buf[out] = '\0';
	return buf;
}

/* ----------------------------------------------------------------
 * Parser
 * ----------------------------------------------------------------
 */

static bool
is_space(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool
is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static bool
is_alpha(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static unsigned char
to_lower(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') ? (unsigned char) (c - 'A' + 'a') : c;
}

/* Case-insensitive comparison of p[0..len) with a lower-case word. */
static bool
word_equals(const char *p, size_t len, const char *word)
{
	size_t		i;

	if (strlen(word) != len)
		return false;
	for (i = 0; i < len; i++)
		if (to_lower((unsigned char) p[i]) != (unsigned char) word[i])
			return false;
	return true;
}

/* A number or a name, as a value of the field. */
static bool
parse_value(int field, const char *p, size_t len, const char *item, size_t item_len,
			int *value, FsCronError *error)
{
	const FieldSpec *spec = &field_specs[field];
	char		q[QUOTE_MAX * 4 + 8];
	char		hint[160];
	size_t		i;

	if (len == 0)
		return cron_fail(error, FS_CRON_SYNTAX, field,
						 "Write a value (5), a range (1-5), a list (1,3,5) or a step (*/15, 1-30/5).",
						 "The %s field has %s, which is missing a value.",
						 field_names[field], quote_token(item, item_len, q, sizeof(q)));

	if (is_digit((unsigned char) p[0]))
	{
		int			v = 0;

		for (i = 0; i < len; i++)
		{
			if (!is_digit((unsigned char) p[i]))
				return cron_fail(error, FS_CRON_SYNTAX, field,
								 "Write a value (5), a range (1-5), a list (1,3,5) or a step (*/15, 1-30/5).",
								 "The %s field has %s, which is not a value, a range or a step.",
								 field_names[field], quote_token(item, item_len, q, sizeof(q)));
			/* Saturate: anything this large is out of range anyway. */
			if (v < 1000000)
				v = v * 10 + (p[i] - '0');
		}
		if (v < spec->min || v > spec->max)
		{
			snprintf(hint, sizeof(hint), "Use values from %d to %d in the %s field.",
					 spec->min, spec->max, field_names[field]);
			return cron_fail(error, FS_CRON_OUT_OF_RANGE, field, hint,
							 "The %s field has %s, outside %d-%d.",
							 field_names[field], quote_token(p, len, q, sizeof(q)),
							 spec->min, spec->max);
		}
		*value = v;
		return true;
	}

	if (is_alpha((unsigned char) p[0]))
	{
		for (i = 0; i < len; i++)
			if (!is_alpha((unsigned char) p[i]))
				return cron_fail(error, FS_CRON_SYNTAX, field,
								 "Write a value (5), a range (1-5), a list (1,3,5) or a step (*/15, 1-30/5).",
								 "The %s field has %s, which is not a value, a range or a step.",
								 field_names[field], quote_token(item, item_len, q, sizeof(q)));
		for (i = 0; i < (size_t) spec->nnames; i++)
			if (word_equals(p, len, spec->names[i]))
			{
				*value = spec->names_base + (int) i;
				return true;
			}
		if (spec->names == NULL)
			return cron_fail(error, FS_CRON_UNKNOWN_NAME, field, spec->name_hint,
							 "The %s field has the name %s, but it takes numbers only.",
							 field_names[field], quote_token(p, len, q, sizeof(q)));
		return cron_fail(error, FS_CRON_UNKNOWN_NAME, field, spec->name_hint,
						 "The %s field has the unknown name %s.",
						 field_names[field], quote_token(p, len, q, sizeof(q)));
	}

	return cron_fail(error, FS_CRON_SYNTAX, field,
					 "Write a value (5), a range (1-5), a list (1,3,5) or a step (*/15, 1-30/5).",
					 "The %s field has %s, which is not a value, a range or a step.",
					 field_names[field], quote_token(item, item_len, q, sizeof(q)));
}

/* The step after '/': a number from 1 to the field's largest value. */
static bool
parse_step(int field, const char *p, size_t len, const char *item, size_t item_len,
		   int *step, FsCronError *error)
{
	const FieldSpec *spec = &field_specs[field];
	char		q[QUOTE_MAX * 4 + 8];
	char		hint[160];
	int			v = 0;
	size_t		i;

	snprintf(hint, sizeof(hint),
			 "Write a step from 1 to %d after the slash, for example */5 or 1-30/5.",
			 spec->max);
	if (len == 0)
		return cron_fail(error, FS_CRON_BAD_STEP, field, hint,
						 "The %s field has %s, a step with no number.",
						 field_names[field], quote_token(item, item_len, q, sizeof(q)));
	for (i = 0; i < len; i++)
	{
		if (!is_digit((unsigned char) p[i]))
			return cron_fail(error, FS_CRON_BAD_STEP, field, hint,
							 "The %s field has %s, whose step is not a number.",
							 field_names[field], quote_token(item, item_len, q, sizeof(q)));
		if (v < 1000000)
			v = v * 10 + (p[i] - '0');
	}
	if (v == 0)
		return cron_fail(error, FS_CRON_BAD_STEP, field, hint,
						 "The %s field has %s, a step of 0.",
						 field_names[field], quote_token(item, item_len, q, sizeof(q)));
	if (v > spec->max)
		return cron_fail(error, FS_CRON_BAD_STEP, field, hint,
						 "The %s field has %s, a step larger than %d.",
						 field_names[field], quote_token(item, item_len, q, sizeof(q)),
						 spec->max);
	*step = v;
	return true;
}

/* One list item: *, N, N-M, each optionally followed by /step. */
static bool
parse_item(int field, const char *item, size_t len, uint64_t *mask, FsCronError *error)
{
	const FieldSpec *spec = &field_specs[field];
	const char *slash = memchr(item, '/', len);
	size_t		range_len = slash ? (size_t) (slash - item) : len;
	const char *dash;
	char		q[QUOTE_MAX * 4 + 8];
	int			lo;
	int			hi;
	int			step = 1;
	int			v;

	if (slash != NULL)
	{
		const char *step_text = slash + 1;
		size_t		step_len = len - range_len - 1;

		if (memchr(step_text, '/', step_len) != NULL)
			return cron_fail(error, FS_CRON_SYNTAX, field,
							 "Write one step per list item, for example */15 or 1-30/5.",
							 "The %s field has %s, with more than one slash.",
							 field_names[field], quote_token(item, len, q, sizeof(q)));
		if (!parse_step(field, step_text, step_len, item, len, &step, error))
			return false;
	}

	if (range_len == 1 && item[0] == '*')
	{
		lo = spec->min;
		hi = spec->star_max;
	}
	else
	{
		if (memchr(item, '*', range_len) != NULL)
			return cron_fail(error, FS_CRON_SYNTAX, field,
							 "Use * alone for every value, or */step; it cannot be part of a range.",
							 "The %s field has %s, with * inside a value or range.",
							 field_names[field], quote_token(item, len, q, sizeof(q)));
		dash = memchr(item, '-', range_len);
		if (dash == NULL)
		{
			if (!parse_value(field, item, range_len, item, len, &lo, error))
				return false;
			/* "N/step" runs from N to where "*" ends, stepping the same way. */
			hi = (slash != NULL && lo < spec->star_max) ? spec->star_max : lo;
		}
		else
		{
			const char *second = dash + 1;
			size_t		second_len = range_len - (size_t) (second - item);

			if (memchr(second, '-', second_len) != NULL)
				return cron_fail(error, FS_CRON_SYNTAX, field,
								 "Write a range as two values, for example 1-5.",
								 "The %s field has %s, with more than one dash.",
								 field_names[field], quote_token(item, len, q, sizeof(q)));
			if (!parse_value(field, item, (size_t) (dash - item), item, len, &lo, error) ||
				!parse_value(field, second, second_len, item, len, &hi, error))
				return false;
			if (lo > hi)
				return cron_fail(error, FS_CRON_REVERSED_RANGE, field,
								 "Write the smaller value first, for example 1-5; a range cannot wrap around (write 22-23,0-2 instead of 22-2).",
								 "The %s field has the range %s, which runs backwards.",
								 field_names[field], quote_token(item, range_len, q, sizeof(q)));
		}
	}

	for (v = lo; v <= hi; v += step)
	{
		/* Day of week 7 is Sunday, like 0. */
		int			bit = (field == FS_CRON_DOW && v == 7) ? 0 : v;

		*mask |= UINT64_C(1) << bit;
	}
	return true;
}

/* Check every byte of a field before looking at its structure. */
static bool
check_characters(int field, const char *p, size_t len, FsCronError *error)
{
	char		q[QUOTE_MAX * 4 + 8];
	size_t		i;

	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) p[i];

		if (is_digit(c) || is_alpha(c) || c == '*' || c == ',' || c == '-' || c == '/')
			continue;
		if (c == '?' || c == '#')
			return cron_fail(error, FS_CRON_BAD_CHARACTER, field,
							 "Quartz-style ? and # are not supported: use * for any day, or list the days.",
							 "The %s field contains the character %s, which this cron does not use.",
							 field_names[field], quote_token(p + i, 1, q, sizeof(q)));
		return cron_fail(error, FS_CRON_BAD_CHARACTER, field,
						 "Use only numbers, names and the characters * , - / in a field, and separate fields with spaces.",
						 "The %s field contains the character %s, which this cron does not use.",
						 field_names[field], quote_token(p + i, 1, q, sizeof(q)));
	}
	return true;
}

/*
 * Parse one field of a cron expression (lists, ranges, steps, names) into
 * the bitmask of the values it allows; false, with `error` filled in, when
 * it is not valid.
 */
static bool
parse_field(int field, const char *p, size_t len, uint64_t *mask, FsCronError *error)
{
	char		q[QUOTE_MAX * 4 + 8];
	size_t		start = 0;

	if (!check_characters(field, p, len, error))
		return false;
	*mask = 0;
	for (;;)
	{
		const char *comma = memchr(p + start, ',', len - start);
		size_t		end = comma ? (size_t) (comma - p) : len;

		if (end == start)
			return cron_fail(error, FS_CRON_EMPTY_ITEM, field,
							 "Remove the extra comma: list items are values, ranges or steps separated by single commas.",
							 "The %s field %s has an empty list item.",
							 field_names[field], quote_token(p, len, q, sizeof(q)));
		if (!parse_item(field, p + start, end - start, mask, error))
			return false;
		if (comma == NULL)
			break;
		start = end + 1;
	}
	return true;
}

typedef struct Macro
{
	const char *name;
	const char *expansion;
} Macro;

static const Macro macros[] = {
	{"@yearly", "0 0 1 1 *"},
	{"@annually", "0 0 1 1 *"},
	{"@monthly", "0 0 1 * *"},
	{"@weekly", "0 0 * * 0"},
	{"@daily", "0 0 * * *"},
	{"@midnight", "0 0 * * *"},
	{"@hourly", "0 * * * *"}
};

#define MACRO_HINT "Use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or write five fields: minute hour day-of-month month day-of-week."

/* Would any day of a month in `months` be in `days`?  (February: 29.) */
static bool
some_month_has_day(uint16_t months, uint32_t days)
{
	int			m;

	for (m = 1; m <= 12; m++)
	{
		uint32_t	dim = (uint32_t) max_days_in_month[m];
		uint32_t	valid = (uint32_t) (((UINT64_C(1) << (dim + 1)) - 1) & ~UINT64_C(1));

		if ((months & (1u << m)) && (days & valid))
			return true;
	}
	return false;
}

/*
 * Split `text` on white space: every field is counted (returned), the
 * first FS_CRON_NFIELDS kept in starts[] and lens[].
 */
static int
cron_split(const char *text, size_t len, const char **starts, size_t *lens)
{
	int			nfields = 0;
	size_t		i = 0;

	while (i < len)
	{
		size_t		start;

		while (i < len && is_space((unsigned char) text[i]))
			i++;
		if (i >= len)
			break;
		start = i;
		while (i < len && !is_space((unsigned char) text[i]))
			i++;
		if (nfields < FS_CRON_NFIELDS)
		{
			starts[nfields] = text + start;
			lens[nfields] = i - start;
		}
		nfields++;
	}
	return nfields;
}

/* A shorthand (@daily, ...) alone in the expression: its five fields, parsed. */
static bool
cron_parse_macro(const char *word, size_t len, int nfields, FsCron *cron, FsCronError *error)
{
	char		q[QUOTE_MAX * 4 + 8];
	size_t		m;

	if (nfields > 1)
		return cron_fail(error, FS_CRON_FIELD_COUNT, FS_CRON_WHOLE, MACRO_HINT,
						 "The shorthand %s is followed by more text.",
						 quote_token(word, len, q, sizeof(q)));
	if (word_equals(word, len, "@reboot"))
		return cron_fail(error, FS_CRON_UNKNOWN_MACRO, FS_CRON_WHOLE, MACRO_HINT,
						 "The shorthand \"@reboot\" is not supported: schedules run at times of day, not when the server starts.");
	for (m = 0; m < sizeof(macros) / sizeof(macros[0]); m++)
		if (word_equals(word, len, macros[m].name))
			return fs_cron_parse(macros[m].expansion, strlen(macros[m].expansion), cron, error);
	return cron_fail(error, FS_CRON_UNKNOWN_MACRO, FS_CRON_WHOLE, MACRO_HINT,
					 "The shorthand %s is not known.", quote_token(word, len, q, sizeof(q)));
}

/*
 * The parsed fields' masks into `cron`, with its flags; false (with
 * `error`) when the day-of-month field names only days the chosen months
 * never have: the schedule would never run.
 */
static bool
cron_build(const char **starts, const size_t *lens, const uint64_t *masks, FsCron *cron,
		   FsCronError *error)
{
	cron->minutes = masks[FS_CRON_MINUTE];
	cron->hours = (uint32_t) masks[FS_CRON_HOUR];
	cron->days = (uint32_t) masks[FS_CRON_DOM];
	cron->months = (uint16_t) masks[FS_CRON_MONTH];
	cron->weekdays = (uint8_t) masks[FS_CRON_DOW];

	/* A day field restricts unless it is exactly "*". */
	if (!(lens[FS_CRON_DOM] == 1 && starts[FS_CRON_DOM][0] == '*'))
		cron->flags |= FS_CRON_DOM_RESTRICTED;
	if (!(lens[FS_CRON_DOW] == 1 && starts[FS_CRON_DOW][0] == '*'))
		cron->flags |= FS_CRON_DOW_RESTRICTED;
	if (memchr(starts[FS_CRON_MINUTE], '*', lens[FS_CRON_MINUTE]) == NULL &&
		memchr(starts[FS_CRON_MINUTE], '/', lens[FS_CRON_MINUTE]) == NULL &&
		memchr(starts[FS_CRON_HOUR], '*', lens[FS_CRON_HOUR]) == NULL &&
		memchr(starts[FS_CRON_HOUR], '/', lens[FS_CRON_HOUR]) == NULL)
		cron->flags |= FS_CRON_FIXED_TIME;

	/*
	 * With the day of week unrestricted, days come from the day-of-month
	 * field alone, and some chosen month must have one of them.
	 */
	if ((cron->flags & FS_CRON_DOM_RESTRICTED) &&
		!(cron->flags & FS_CRON_DOW_RESTRICTED) &&
		!some_month_has_day(cron->months, cron->days))
	{
		char		q[QUOTE_MAX * 4 + 8];
		char		q2[QUOTE_MAX * 4 + 8];

		return cron_fail(error, FS_CRON_NEVER, FS_CRON_DOM,
						 "Choose days that the chosen months have (February has at most 29 days; April, June, September and November have 30), or restrict the day-of-week field instead.",
						 "The day-of-month field %s names only days that the months of the month field %s never have, so the schedule would never run.",
						 quote_token(starts[FS_CRON_DOM], lens[FS_CRON_DOM], q, sizeof(q)),
						 quote_token(starts[FS_CRON_MONTH], lens[FS_CRON_MONTH], q2, sizeof(q2)));
	}
	return true;
}

/*
 * Parse a cron expression of five fields (minute hour day-of-month month
 * day-of-week) or a macro (@daily, ...) into `cron`; false, with `error`
 * saying which field and why, when it is not valid.
 */
bool
fs_cron_parse(const char *text, size_t len, FsCron *cron, FsCronError *error)
{
	const char *starts[FS_CRON_NFIELDS];
	size_t		lens[FS_CRON_NFIELDS];
	uint64_t	masks[FS_CRON_NFIELDS];
	int			nfields;
	int			f;

	memset(cron, 0, sizeof(*cron));
	memset(error, 0, sizeof(*error));

	if (len > FS_CRON_MAX_LENGTH)
		return cron_fail(error, FS_CRON_TOO_LONG, FS_CRON_WHOLE,
						 "Shorten the expression: use ranges (1-5) and steps (*/5) instead of long lists.",
						 "The expression is %zu bytes long; the limit is %d.",
						 len, FS_CRON_MAX_LENGTH);

	nfields = cron_split(text, len, starts, lens);
	if (nfields == 0)
		return cron_fail(error, FS_CRON_EMPTY, FS_CRON_WHOLE,
						 "Write five fields: minute hour day-of-month month day-of-week, for example '0 3 * * *' for 03:00 every day.",
						 "The expression is empty.");
	if (starts[0][0] == '@')
		return cron_parse_macro(starts[0], lens[0], nfields, cron, error);
	if (nfields != FS_CRON_NFIELDS)
		return cron_fail(error, FS_CRON_FIELD_COUNT, FS_CRON_WHOLE,
						 nfields > FS_CRON_NFIELDS ?
						 "Remove the extra fields: this cron has no seconds or year field, just minute hour day-of-month month day-of-week." :
						 "Write five fields: minute hour day-of-month month day-of-week, for example '0 3 * * *' for 03:00 every day.",
						 "The expression has %d field%s; five are expected (minute hour day-of-month month day-of-week).",
						 nfields, nfields == 1 ? "" : "s");

	for (f = 0; f < FS_CRON_NFIELDS; f++)
		if (!parse_field(f, starts[f], lens[f], &masks[f], error))
			return false;
	return cron_build(starts, lens, masks, cron, error);
}
