/*-------------------------------------------------------------------------
 *
 * cron.c
 *	  The cron engine: parser and next-run search (see cron.h).
 *
 * This file deliberately includes no PostgreSQL header: it is linked both
 * into the module and, on its own, into the libFuzzer target.
 *
 * Parsing is one pass over at most FS_CRON_MAX_LENGTH bytes.  The next-run
 * search never scans minute by minute: it jumps field by field on the wall
 * clock (month, then day, then hour, then minute, with carries) and walks
 * the zone's offset spans forward, so its cost depends on the number of DST
 * transitions it crosses, not on how far away the run is.  Every loop has a
 * fixed bound.
 *
 * Two ways of mapping wall times to instants (cron.h, fs_cron_next):
 *
 *	 - every expression: the instants t whose wall time t + offset(t) is a
 *	   matching whole minute.  A wall time in a spring-forward gap has no such
 *	   instant; one in a fall-back overlap has two.
 *
 *	 - fixed-time expressions: each matching wall time W runs once, at
 *	   f(W) = the first instant whose wall time is at or after W.  That is
 *	   the first occurrence of W when it exists, and the transition instant
 *	   (the first instant after the jump) when W falls in a gap.  f is
 *	   non-decreasing in W, which is what makes the search below correct.
 *
 *-------------------------------------------------------------------------
 */
#include "schedules/cron.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SECS_PER_MINUTE		60
#define SECS_PER_DAY		86400
#define HORIZON_SECS		((int64_t) FS_CRON_HORIZON_YEARS * 366 * SECS_PER_DAY)

/* Bounds on the search loops; real zones need a few dozen at most. */
#define MAX_SPANS_PER_SEARCH	4096
#define MAX_FIXED_ATTEMPTS		4096

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

static const int days_in_month_table[2][13] = {
	{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31},
	{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
};

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
		uint32_t	dim = (uint32_t) days_in_month_table[1][m];
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

/* ----------------------------------------------------------------
 * Calendar arithmetic on the proleptic Gregorian calendar
 * ----------------------------------------------------------------
 */

static int64_t
floor_div(int64_t a, int64_t b)
{
	int64_t		q = a / b;

	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

static bool
is_leap(int64_t y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int
days_in_month(int64_t y, int m)
{
	return days_in_month_table[is_leap(y) ? 1 : 0][m];
}

/* Days since 1970-01-01 of a civil date (era arithmetic: exact for any year). */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
	int64_t		era;
	int64_t		yoe;
	int64_t		doy;
	int64_t		doe;

	y -= (m <= 2);
	era = floor_div(y, 400);
	yoe = y - era * 400;
	doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

/*
 * The calendar date (year, month, day) of day `z` since 1970-01-01, in the
 * proleptic Gregorian calendar.
 */
static void
civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
	int64_t		era;
	int64_t		doe;
	int64_t		yoe;
	int64_t		doy;
	int64_t		mp;

	z += 719468;
	era = floor_div(z, 146097);
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	*d = (int) (doy - (153 * mp + 2) / 5 + 1);
	*m = (int) (mp < 10 ? mp + 3 : mp - 9);
	*y = yoe + era * 400 + (*m <= 2);
}

/* 0 = Sunday; 1970-01-01 was a Thursday. */
static int
weekday_of(int64_t days)
{
	return (int) (days - floor_div(days + 4, 7) * 7 + 4);
}

/* Smallest set bit of mask at or above `from`, or -1. */
static int
next_bit(uint64_t mask, int from)
{
	if (from >= 64)
		return -1;
	mask &= ~((UINT64_C(1) << from) - 1);
	return mask ? __builtin_ctzll(mask) : -1;
}

static bool
day_matches(const FsCron *cron, int dom, int dow)
{
	bool		dom_ok = (cron->days >> dom) & 1;
	bool		dow_ok = (cron->weekdays >> dow) & 1;

	/* Both restricted: either matches.  Otherwise the other mask is full. */
	if ((cron->flags & (FS_CRON_DOM_RESTRICTED | FS_CRON_DOW_RESTRICTED)) ==
		(FS_CRON_DOM_RESTRICTED | FS_CRON_DOW_RESTRICTED))
		return dom_ok || dow_ok;
	return dom_ok && dow_ok;
}

static int64_t
ceil_minute(int64_t wall)
{
	return floor_div(wall + SECS_PER_MINUTE - 1, SECS_PER_MINUTE) * SECS_PER_MINUTE;
}

/* A position on the wall clock while searching. */
typedef struct WallPos
{
	int64_t		year;
	int			month;
	int			day;
	int			hour;
	int			minute;
} WallPos;

/* Move to the first minute of the next month. */
static void
next_month(WallPos *p)
{
	p->month++;
	if (p->month > 12)
	{
		p->year++;
		p->month = 1;
	}
	p->day = 1;
	p->hour = 0;
	p->minute = 0;
}

/* Move to the first minute of the next day. */
static void
next_day(WallPos *p)
{
	if (p->day >= days_in_month(p->year, p->month))
		next_month(p);
	else
	{
		p->day++;
		p->hour = 0;
		p->minute = 0;
	}
}

/*
 * The first matching wall time at or after `from`, if it is before `limit`.
 * Jumps a field at a time: a month that does not match moves to the next
 * one that does, and so on down to the minute.  The loop runs at most a few
 * times per day visited, and days are only visited in matching months.
 */
static bool
next_wall(const FsCron *cron, int64_t from, int64_t limit, int64_t *out)
{
	int64_t		wall = ceil_minute(from);
	int64_t		days = floor_div(wall, SECS_PER_DAY);
	int			secs = (int) (wall - days * SECS_PER_DAY);
	int64_t		limit_year;
	int			limit_month;
	int			limit_day;
	WallPos		p;

	civil_from_days(floor_div(limit, SECS_PER_DAY), &limit_year, &limit_month, &limit_day);
	civil_from_days(days, &p.year, &p.month, &p.day);
	p.hour = secs / 3600;
	p.minute = (secs % 3600) / 60;

	for (;;)
	{
		int			m;
		int			dim;
		int			dow;
		int			h;
		int			mi;

		if (p.year > limit_year)
			return false;

		m = next_bit(cron->months, p.month);
		if (m < 0)
		{
			p.month = 12;
			next_month(&p);
			continue;
		}
		if (m != p.month)
		{
			p.month = m;
			p.day = 1;
			p.hour = 0;
			p.minute = 0;
		}

		dim = days_in_month(p.year, p.month);
		dow = weekday_of(days_from_civil(p.year, p.month, p.day));
		while (p.day <= dim && !day_matches(cron, p.day, dow))
		{
			p.day++;
			dow = (dow + 1) % 7;
			p.hour = 0;
			p.minute = 0;
		}
		if (p.day > dim)
		{
			next_month(&p);
			continue;
		}

		h = next_bit(cron->hours, p.hour);
		if (h < 0)
		{
			next_day(&p);
			continue;
		}
		if (h != p.hour)
		{
			p.hour = h;
			p.minute = 0;
		}

		mi = next_bit(cron->minutes, p.minute);
		if (mi < 0)
		{
			if (p.hour == 23)
				next_day(&p);
			else
			{
				p.hour++;
				p.minute = 0;
			}
			continue;
		}

		*out = days_from_civil(p.year, p.month, p.day) * SECS_PER_DAY +
			p.hour * 3600 + mi * SECS_PER_MINUTE;
		return *out < limit;
	}
}

/* ----------------------------------------------------------------
 * Next-run search
 * ----------------------------------------------------------------
 */

static bool
zone_lookup(const FsCronZone *zone, int64_t t, FsCronSpan *span)
{
	if (!zone->lookup(zone->arg, t, span))
		return false;
	/* Defend the loops below against a zone that answers nonsense. */
	if (span->offset <= -FS_CRON_MAX_OFFSET || span->offset >= FS_CRON_MAX_OFFSET)
		return false;
	if (span->has_end && span->end <= t)
		return false;
	return true;
}

/* Every instant whose wall time matches (expressions that are not fixed-time). */
static FsCronNextStatus
next_any(const FsCron *cron, const FsCronZone *zone, int64_t after, int64_t *next)
{
	int64_t		t = after + 1;
	FsCronSpan	span;
	int64_t		limit;
	int			i;

	if (!zone_lookup(zone, t, &span))
		return FS_CRON_ZONE_FAILED;
	limit = t + span.offset + HORIZON_SECS;

	for (i = 0; i < MAX_SPANS_PER_SEARCH; i++)
	{
		int64_t		wall;

		/* The first match on this span's wall clock, from t on. */
		if (!next_wall(cron, t + span.offset, limit, &wall))
			return FS_CRON_NONE;
		if (!span.has_end || wall - span.offset < span.end)
		{
			*next = wall - span.offset;
			return FS_CRON_FOUND;
		}
		/* It falls after this span ends: look again from the next span. */
		t = span.end;
		if (!zone_lookup(zone, t, &span))
			return FS_CRON_ZONE_FAILED;
	}
	return FS_CRON_ZONE_FAILED;
}

/*
 * f(W): the first instant whose wall time is at or after W.  Also returns
 * the span it was found in: its offset, and where it ends, so that the
 * caller can skip wall times that map into the same past span.
 */
static bool
first_instant_at_wall(const FsCronZone *zone, int64_t wall, int64_t *instant,
					  bool *in_gap, FsCronSpan *found)
{
	int64_t		s = wall - FS_CRON_MAX_OFFSET;
	FsCronSpan	span;
	int			i;

	if (!zone_lookup(zone, s, &span))
		return false;
	for (i = 0; i < MAX_SPANS_PER_SEARCH; i++)
	{
		/*
		 * The span [s, end) shows wall times [s + offset, end + offset).  (s
		 * starts MAX_OFFSET early, so the first span never ends the walk
		 * through the first test.)
		 */
		if (wall <= s + span.offset)
		{
			/* W was skipped by the jump at s: run at s. */
			*instant = s;
			*in_gap = (wall < s + span.offset);
			*found = span;
			return true;
		}
		if (!span.has_end || wall < span.end + span.offset)
		{
			*instant = wall - span.offset;
			*in_gap = false;
			*found = span;
			return true;
		}
		s = span.end;
		if (!zone_lookup(zone, s, &span))
			return false;
	}
	return false;
}

/* Fixed-time expressions: each matching wall time W runs once, at f(W). */
static FsCronNextStatus
next_fixed(const FsCron *cron, const FsCronZone *zone, int64_t after, int64_t *next)
{
	FsCronSpan	span;
	int64_t		from;
	int64_t		limit;
	int			i;

	/*
	 * Wall times before after's own are all mapped at or before `after` (f
	 * is non-decreasing and f(wall(after)) >= after), so start there.
	 */
	if (!zone_lookup(zone, after, &span))
		return FS_CRON_ZONE_FAILED;
	from = after + span.offset;
	limit = from + HORIZON_SECS;

	for (i = 0; i < MAX_FIXED_ATTEMPTS; i++)
	{
		int64_t		wall;
		int64_t		instant;
		bool		in_gap;
		FsCronSpan	found;

		if (!next_wall(cron, from, limit, &wall))
			return FS_CRON_NONE;
		if (!first_instant_at_wall(zone, wall, &instant, &in_gap, &found))
			return FS_CRON_ZONE_FAILED;
		if (instant > after)
		{
			*next = instant;
			return FS_CRON_FOUND;
		}

		/*
		 * W ran already (at or before `after`).  Later wall times of the same
		 * gap run at the same instant, and those up to the end of a span that
		 * ended by `after` ran in it: skip them all at once.
		 */
		from = wall + SECS_PER_MINUTE;
		if (in_gap)
		{
			if (instant + found.offset > from)
				from = instant + found.offset;
		}
		else if (found.has_end && found.end <= after &&
				 found.end + found.offset > from)
			from = found.end + found.offset;
	}
	return FS_CRON_ZONE_FAILED;
}

FsCronNextStatus
fs_cron_next(const FsCron *cron, const FsCronZone *zone, int64_t after, int64_t *next)
{
	if (after > FS_CRON_MAX_INSTANT || after < -FS_CRON_MAX_INSTANT)
		return FS_CRON_OUT_OF_DOMAIN;
	if (cron->flags & FS_CRON_FIXED_TIME)
		return next_fixed(cron, zone, after, next);
	return next_any(cron, zone, after, next);
}

bool
fs_cron_fixed_zone(const void *arg, int64_t t, FsCronSpan *span)
{
	(void) t;
	span->offset = *(const int32_t *) arg;
	span->has_end = false;
	span->end = 0;
	return true;
}
