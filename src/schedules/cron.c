/*-------------------------------------------------------------------------
 *
 * cron.c
 *	  The cron engine's next-run search (see cron.h); its parser is in
 *	  cron_parse.c.
 *
 * This file deliberately includes no PostgreSQL header: it is linked both
 * into the module and, on its own, into the libFuzzer target.
 *
 * The next-run search never scans minute by minute: it jumps field by field on the wall
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

static const int days_in_month_table[2][13] = {
	{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31},
	{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
};

/* ----------------------------------------------------------------
 * Calendar arithmetic on the proleptic Gregorian calendar
 * ----------------------------------------------------------------
 */

/* a / b rounded towards minus infinity. */
static int64_t
floor_div(int64_t a, int64_t b)
{
	int64_t		q = a / b;

	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

/* Is `y` a leap year of the proleptic Gregorian calendar? */
static bool
is_leap(int64_t y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* Days of month `m` (1-12) of year `y`. */
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

/* Does a day (day of month, day of week) match, by cron's rule for the two day fields? */
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

/* The first whole minute at or after wall time `wall`. */
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

/* The zone's offset span at `t`; false for a zone that answers nothing or nonsense. */
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

/* The next run after `after` (cron.h): by the fixed-time rule or the every-instant rule. */
FsCronNextStatus
fs_cron_next(const FsCron *cron, const FsCronZone *zone, int64_t after, int64_t *next)
{
	if (after > FS_CRON_MAX_INSTANT || after < -FS_CRON_MAX_INSTANT)
		return FS_CRON_OUT_OF_DOMAIN;
	if (cron->flags & FS_CRON_FIXED_TIME)
		return next_fixed(cron, zone, after, next);
	return next_any(cron, zone, after, next);
}

/* A zone with one fixed offset (*arg seconds east of UTC), for tests and UTC. */
bool
fs_cron_fixed_zone(const void *arg, int64_t t, FsCronSpan *span)
{
	(void) t;
	span->offset = *(const int32_t *) arg;
	span->has_end = false;
	span->end = 0;
	return true;
}
