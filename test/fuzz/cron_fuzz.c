/*
 * cron_fuzz.c: libFuzzer target for the cron engine (src/schedules/cron.c).
 *
 * Every input is first given whole to the parser, which must never crash,
 * hang or write out of bounds, and must fill in an error with a field and a
 * detail whenever it says no.  Then the input is read as
 *
 *   byte 0        era of `after` (1900, 1970, 2024, 2400, or year -200)
 *   bytes 1..4    seconds added to the era's base: where `after` falls
 *   byte 5        offset before the first transition, in quarter hours
 *   byte 6        number of transitions (0..6)
 *   bytes 7..24   per transition: minutes since the previous one (2 bytes)
 *                 and the new offset in quarter hours (1 byte, signed)
 *   the rest      a cron expression
 *
 * and, when the expression parses, the next run in that synthetic zone is
 * checked against a brute-force answer computed straight from the
 * definitions in cron.h: the first matching minute after `after` for
 * ordinary expressions, and min f(W) over matching wall times W for
 * fixed-time ones, where f(W) is the first instant whose wall time is at or
 * after W.  The zones have gaps and overlaps of any size up to 32 hours,
 * close together, which real zones rarely have.
 *
 * Build and run with test/fuzz/run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "schedules/cron.h"

#define MAX_TRANSITIONS	6
#define WINDOW			(2 * 86400)		/* brute force over two days */

typedef struct Zone
{
	int			count;
	int64_t		at[MAX_TRANSITIONS];	/* increasing */
	int32_t		offset[MAX_TRANSITIONS + 1];	/* offset[i] before at[i] */
} Zone;

static bool
zone_lookup(const void *arg, int64_t t, FsCronSpan *span)
{
	const Zone *z = (const Zone *) arg;
	int			i = 0;

	while (i < z->count && z->at[i] <= t)
		i++;
	span->offset = z->offset[i];
	span->has_end = i < z->count;
	span->end = span->has_end ? z->at[i] : 0;
	return true;
}

static int32_t
offset_at(const Zone *z, int64_t t)
{
	FsCronSpan	span;

	zone_lookup(z, t, &span);
	return span.offset;
}

static int64_t
floor_div(int64_t a, int64_t b)
{
	int64_t		q = a / b;

	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

/* Does the wall time (seconds, local) match?  Decomposed by gmtime_r. */
static bool
wall_matches(const FsCron *c, int64_t wall)
{
	time_t		tt = (time_t) wall;
	struct tm	tm;
	bool		dom_ok;
	bool		dow_ok;
	bool		day_ok;

	if (floor_div(wall, 60) * 60 != wall)
		return false;
	if (gmtime_r(&tt, &tm) == NULL)
		abort();
	dom_ok = (c->days >> tm.tm_mday) & 1;
	dow_ok = (c->weekdays >> tm.tm_wday) & 1;
	if ((c->flags & FS_CRON_DOM_RESTRICTED) && (c->flags & FS_CRON_DOW_RESTRICTED))
		day_ok = dom_ok || dow_ok;
	else
		day_ok = dom_ok && dow_ok;
	return day_ok &&
		((c->minutes >> tm.tm_min) & 1) &&
		((c->hours >> tm.tm_hour) & 1) &&
		((c->months >> (tm.tm_mon + 1)) & 1);
}

/* f(W) from its definition: the least t with t + offset(t) >= W. */
static int64_t
first_instant(const Zone *z, int64_t wall)
{
	int64_t		best = INT64_MAX;
	int			i;

	for (i = 0; i <= z->count; i++)
	{
		int64_t		start = (i == 0) ? INT64_MIN / 4 : z->at[i - 1];
		int64_t		end = (i == z->count) ? INT64_MAX / 4 : z->at[i];
		int64_t		t = wall - z->offset[i];

		if (t < start)
			t = start;
		if (t < end && t < best)
			best = t;
	}
	return best;
}

static void
fail(const char *what, const char *expr, size_t len, int64_t after, int64_t got, int64_t want)
{
	fprintf(stderr, "%s: expression \"%.*s\" after %lld: got %lld, want %lld\n",
			what, (int) len, expr, (long long) after, (long long) got, (long long) want);
	abort();
}

static const int64_t era_base[] = {
	INT64_C(-2208988800),		/* 1900-01-01 */
	INT64_C(0),					/* 1970-01-01 */
	INT64_C(1710028800),		/* 2024-03-10 */
	INT64_C(13569465600),		/* 2400-01-01 */
	INT64_C(-68519980800)		/* year -200 */
};

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FsCron		cron;
	FsCronError error;
	Zone		zone;
	FsCronZone	fz;
	int64_t		after;
	int64_t		got = 0;
	FsCronNextStatus status;
	const char *expr;
	size_t		len;
	int			i;

	/* The parser on arbitrary bytes. */
	if (!fs_cron_parse((const char *) data, size, &cron, &error))
	{
		if (error.code == FS_CRON_OK || error.detail[0] == '\0' || error.hint[0] == '\0' ||
			strlen(fs_cron_field_name(error.field)) == 0)
			abort();
	}

	if (size < 25)
		return 0;

	after = era_base[data[0] % 5] +
		(int64_t) (((uint32_t) data[1] << 24 | (uint32_t) data[2] << 16 |
					(uint32_t) data[3] << 8 | data[4]) % (8u * 86400u)) - 4 * 86400;

	/* A zone with transitions around `after`, on whole minutes. */
	memset(&zone, 0, sizeof(zone));
	zone.offset[0] = (int32_t) (int8_t) data[5] * 900;
	zone.count = data[6] % (MAX_TRANSITIONS + 1);
	{
		int64_t		at = floor_div(after, 60) * 60 - 2 * 86400;

		for (i = 0; i < zone.count; i++)
		{
			at += 60 + 60 * (int64_t) (((uint32_t) data[7 + 3 * i] << 8 | data[8 + 3 * i]) % 4320u);
			zone.at[i] = at;
			zone.offset[i + 1] = (int32_t) (int8_t) data[9 + 3 * i] * 900;
		}
	}
	fz.lookup = zone_lookup;
	fz.arg = &zone;

	expr = (const char *) data + 25;
	len = size - 25;
	if (!fs_cron_parse(expr, len, &cron, &error))
		return 0;

	status = fs_cron_next(&cron, &fz, after, &got);
	if (status == FS_CRON_ZONE_FAILED || status == FS_CRON_OUT_OF_DOMAIN)
		fail("search failed", expr, len, after, (int64_t) status, 0);
	if (status == FS_CRON_FOUND && got <= after)
		fail("not after", expr, len, after, got, after + 1);

	if (!(cron.flags & FS_CRON_FIXED_TIME))
	{
		/* The first instant in the window whose wall time matches. */
		int64_t		t;

		for (t = floor_div(after, 60) * 60 + 60; t <= after + WINDOW; t += 60)
			if (wall_matches(&cron, t + offset_at(&zone, t)))
			{
				if (status != FS_CRON_FOUND || got != t)
					fail("ordinary", expr, len, after, got, t);
				return 0;
			}
		if (status == FS_CRON_FOUND && got <= after + WINDOW)
			fail("ordinary, beyond window", expr, len, after, got, 0);
		if (status == FS_CRON_FOUND &&
			!wall_matches(&cron, got + offset_at(&zone, got)))
			fail("ordinary, no match", expr, len, after, got, 0);
	}
	else
	{
		/* min f(W) > after over matching wall times W near the window. */
		int64_t		want = INT64_MAX;
		int64_t		w;
		int64_t		lo = floor_div(after - 40 * 3600, 60) * 60;
		int64_t		hi = after + WINDOW + 40 * 3600;

		for (w = lo; w <= hi; w += 60)
			if (wall_matches(&cron, w))
			{
				int64_t		f = first_instant(&zone, w);

				if (f > after && f < want)
					want = f;
			}
		if (want <= after + WINDOW)
		{
			if (status != FS_CRON_FOUND || got != want)
				fail("fixed-time", expr, len, after, got, want);
		}
		else if (status == FS_CRON_FOUND && got <= after + WINDOW)
			fail("fixed-time, beyond window", expr, len, after, got, want);
	}
	return 0;
}
