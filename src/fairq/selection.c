/*-------------------------------------------------------------------------
 *
 * selection.c
 *	  A claim's selection: fs_claim()'s selector_in and selector_not_in,
 *	  names or patterns ('*' for any characters) of the queue's selector,
 *	  turned into LIKE patterns that the claim query takes as parameters
 *	  (register_cache.c's fs_q_selection()), never as SQL text.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "fairq/fairqueue_int.h"

/*
 * One of fs_claim()'s selector patterns as a LIKE pattern: '*' matches any
 * run of characters, every other character itself (LIKE's own wildcards
 * and its escape are escaped).
 */
static Datum
fs_like_pattern(text *pattern)
{
	const char *p = VARDATA_ANY(pattern);
	int			len = VARSIZE_ANY_EXHDR(pattern);
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < len; i++)
	{
		if (p[i] == '*')
			appendStringInfoChar(&buf, '%');
		else
		{
			if (p[i] == '%' || p[i] == '_' || p[i] == '\\')
				appendStringInfoChar(&buf, '\\');
			appendStringInfoChar(&buf, p[i]);
		}
	}
	return PointerGetDatum(cstring_to_text_with_len(buf.data, buf.len));
}

/*
 * A text[] argument of selector patterns, as LIKE patterns; (Datum) 0 when
 * it is NULL.  Its elements must not be NULL.
 */
static Datum
fs_selection_patterns(FunctionCallInfo fcinfo, int argno, const char *name)
{
	ArrayType  *array;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return (Datum) 0;
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", name),
				 errhint("Pass a list of names or patterns, such as '{mailers,tenant_a*}'.")));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", name),
					 errhint("Pass names, or patterns with * for any characters.")));
		elems[i] = fs_like_pattern(DatumGetTextPP(elems[i]));
	}
	return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * fs_claim()'s selection (selector_in, selector_not_in, arguments `first`
 * and `first` + 1): only for a queue registered with a selector.
 */
void
fs_selection_args(FunctionCallInfo fcinfo, int first, FsFairDesc *desc, FsSelection *sel)
{
	memset(sel, 0, sizeof(*sel));
	sel->in = fs_selection_patterns(fcinfo, first, "selector_in");
	sel->not_in = fs_selection_patterns(fcinfo, first + 1, "selector_not_in");
	sel->active = sel->in != (Datum) 0 || sel->not_in != (Datum) 0;
	if (sel->active && desc->selector == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queue \"%s\" has no selector to select rows by", desc->queue_name),
				 errhint("Register the queue with selector => the column a claim selects by, such as 'queue_name'.")));
}

/* Slot of `entry` in the passed-over set: where it is, or the free one it would take. */
static int
fs_passed_over_slot(const void *const *set, int size, const void *entry)
{
	uint32		h = (uint32) (((uintptr_t) entry >> 4) * 2654435761u);
	int			mask = size - 1;
	int			i;

	for (i = h & mask; set[i] != NULL && set[i] != entry; i = (i + 1) & mask)
		;
	return i;
}

/*
 * Make room in the claim's passed-over set for `more` tenants or leaves
 * (sub-keys of a tenant, subkeys.c; at most half
 * full), before a round changes shared state: adding one then cannot fail.
 */
void
fs_passed_over_reserve(FsSelection *sel, int more)
{
	const void **old = sel->passed_over;
	int			old_size = sel->passed_size;
	int			size = Max(old_size, 16);

	while (size < 2 * (sel->npassed_over + more))
		size <<= 1;
	if (size == old_size)
		return;
	sel->passed_over = palloc0(sizeof(const void *) * size);
	sel->passed_size = size;
	for (int i = 0; i < old_size; i++)
		if (old[i] != NULL)
			sel->passed_over[fs_passed_over_slot(sel->passed_over, size, old[i])] = old[i];
	if (old != NULL)
		pfree(old);
}

/* Pass `entry` over for the rest of the claim (room was reserved). */
void
fs_passed_over_add(FsSelection *sel, const void *entry)
{
	int			i;

	Assert(2 * (sel->npassed_over + 1) <= sel->passed_size);
	i = fs_passed_over_slot(sel->passed_over, sel->passed_size, entry);
	if (sel->passed_over[i] == NULL)
	{
		sel->passed_over[i] = entry;
		sel->npassed_over++;
	}
}

/* Was `entry` passed over earlier in the claim? */
bool
fs_passed_over_has(const FsSelection *sel, const void *entry)
{
	if (sel->npassed_over == 0)
		return false;
	return sel->passed_over[fs_passed_over_slot(sel->passed_over, sel->passed_size, entry)] == entry;
}
