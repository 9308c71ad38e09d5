/*-------------------------------------------------------------------------
 *
 * register_int.h
 *	  What the files of registration share (register.c, register_parse.c,
 *	  register_cache.c, register_triggers.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_REGISTER_INT_H
#define FAIRSHARE_REGISTER_INT_H

#include "fairq/fairqueue_int.h"

/* fairshare's row triggers on a ready and a running table (triggers.c looks for Citus's copies). */
#define FS_TRIGGER_READY	"fs_fair_ready"
#define FS_TRIGGER_RUN		"fs_fair_running"

/* The alias of the ready table in every query fairshare builds. */
#define FS_ROW_ALIAS		"fairshare_row"

typedef enum FsExprRole
{
	FS_EXPR_TENANT,
	FS_EXPR_ORDER,
	FS_EXPR_FILTER,
	FS_EXPR_KEY,
	FS_EXPR_COST,
	FS_EXPR_RUNNING_FILTER,
	FS_EXPR_RUNNING_KEY,
	FS_EXPR_ENQUEUED_AT,
	FS_EXPR_SELECTOR,
	FS_EXPR_SUBKEY
} FsExprRole;

extern const char *const fs_role_names[];

/* One item of order_by. */
typedef struct FsOrderItem
{
	Node	   *expr;
	bool		desc;
	bool		nulls_first;
	SortByNulls nulls;
} FsOrderItem;

extern Node *fs_compile(const char *text, Relation rel, FsExprRole role, const char *queue);
extern List *fs_compile_order(const char *text, Relation rel, const char *queue);
extern char *fs_deparse(Node *expr, Relation rel);
extern char *fs_deparse_order(List *items, Relation rel, bool for_index);
extern char *fs_qualified_name(Oid relid);
extern void fs_check_may_replace(HeapTuple old, TupleDesc old_desc, const char *queue_name, const char *action);
extern Relation fs_open_table(Oid relid, const char *what, const char *queue_name);
extern char *fs_primary_key(Relation rel, const char *queue_name);
extern Node *fs_strip_relabel(Node *node);
extern Oid fs_find_index(Relation rel, Node *tenant, List *order, List *ready_quals);
extern bool fs_key_is_unique(Relation rel, Node *key, AttrNumber tenant_attnum);
extern char *fs_index_definition(Relation rel, const char *name, Node *tenant, List *order, const char *ready_filter);
extern int fs_spi(const char *sql, int nargs, Oid *argtypes, Datum *values, const char *nulls, bool read_only);
extern const char *fs_ext_schema(void);
extern HeapTuple fs_registration_row(const char *queue_name, TupleDesc *desc);
extern Oid fs_row_oid(HeapTuple tuple, TupleDesc desc, const char *column);

/* register_triggers.c */
extern void fs_sync_triggers(Oid relid);

#endif							/* FAIRSHARE_REGISTER_INT_H */
