/*-------------------------------------------------------------------------
 *
 * register_triggers.c
 *	  The triggers fair dequeue puts on registered tables: which table of a
 *	  partition tree carries them, which columns they fire on, making and
 *	  dropping them (fs_sync_triggers(), called by register.c whenever a
 *	  registration changes).  What they do when they fire is triggers.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/sysattr.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "optimizer/optimizer.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "core/cluster.h"
#include "core/run_as.h"
#include "fairq/register_int.h"

/* Names of the triggers fairshare puts on registered tables. */
#define FS_TRIGGER_READY_T	"fs_fair_ready_truncate"
#define FS_TRIGGER_RUN_T	"fs_fair_running_truncate"

/*
 * Add the columns `text` (compiled against rel) reads to *cols; with
 * FS_EXPR_ORDER, `text` is an order_by list.
 */
static void
fs_add_columns(Bitmapset **cols, const char *text, Relation rel, FsExprRole role,
			   const char *queue)
{
	int			nest;

	if (text == NULL)
		return;
	nest = fs_search_path_begin();
	if (role == FS_EXPR_ORDER)
	{
		ListCell   *lc;

		foreach(lc, fs_compile_order(text, rel, queue))
			pull_varattnos(((FsOrderItem *) lfirst(lc))->expr, 1, cols);
	}
	else
		pull_varattnos(fs_compile(text, rel, role, queue), 1, cols);
	fs_search_path_end(nest);
}

/*
 * Add the columns `text` reads to *cols, numbered as in `home`: the text
 * is compiled against its own table `own` (a partition of home, or home),
 * whose column numbers may differ, and mapped by name.
 */
static void
fs_add_columns_of(Bitmapset **cols, const char *text, Relation home, Relation own,
				  FsExprRole role, const char *queue)
{
	Bitmapset  *own_cols = NULL;
	int			member = -1;

	if (own == home)
	{
		fs_add_columns(cols, text, home, role, queue);
		return;
	}
	fs_add_columns(&own_cols, text, own, role, queue);
	while ((member = bms_next_member(own_cols, member)) >= 0)
	{
		AttrNumber	a = member + FirstLowInvalidHeapAttributeNumber;
		AttrNumber	h;

		if (a <= 0)
		{
			*cols = bms_add_member(*cols, member);	/* the whole row, or a system column */
			continue;
		}
		h = get_attnum(RelationGetRelid(home), get_attname(RelationGetRelid(own), a, false));
		if (h != InvalidAttrNumber)
			*cols = bms_add_member(*cols, h - FirstLowInvalidHeapAttributeNumber);
	}
}

/* " OF a, b" for the columns in cols, or "" when a whole row is read. */
static char *
fs_update_of(Bitmapset *cols, Relation rel)
{
	StringInfoData buf;
	int			attno = -1;

	if (bms_is_member(0 - FirstLowInvalidHeapAttributeNumber, cols))
		return "";
	initStringInfo(&buf);
	while ((attno = bms_next_member(cols, attno)) >= 0)
	{
		AttrNumber	a = attno + FirstLowInvalidHeapAttributeNumber;

		appendStringInfoString(&buf, buf.len == 0 ? " OF " : ", ");
		appendStringInfoString(&buf, quote_identifier(get_attname(RelationGetRelid(rel), a, false)));
	}
	return buf.data;
}

/*
 * Drop trigger `name` of relid if it has one of its own, and it must be
 * ours.  A trigger a partition inherits from its parent's goes with it.
 */
static void
fs_drop_trigger(Oid relid, const char *name, const char *function)
{
	Oid			argtypes[2] = {OIDOID, TEXTOID};
	Datum		values[2];
	bool		isnull;
	bool		ours;

	values[0] = ObjectIdGetDatum(relid);
	values[1] = CStringGetTextDatum(name);
	fs_spi(psprintf("SELECT t.tgfoid = '%s.%s'::pg_catalog.regproc FROM pg_catalog.pg_trigger t"
					" WHERE t.tgrelid = $1 AND t.tgname = $2 AND t.tgparentid = 0",
					fs_ext_schema(), function),
		   2, argtypes, values, NULL, false);
	if (SPI_processed == 0)
		return;
	ours = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (!ours)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("table %s already has a trigger named \"%s\"",
						get_rel_name(relid), name),
				 errhint("fairshare needs that name for its own trigger; rename yours.")));
	fs_spi(psprintf("DROP TRIGGER %s ON %s", quote_identifier(name),
					fs_qualified_name(relid)),
		   0, NULL, NULL, NULL, false);
}

/* A row trigger and a TRUNCATE trigger on `table`. */
static void
fs_create_triggers(const char *table, const char *name, const char *events, const char *update_of,
				   const char *function, const char *truncate_name, const char *role)
{
	fs_spi(psprintf("CREATE TRIGGER %s AFTER %s%s ON %s FOR EACH ROW EXECUTE FUNCTION %s.%s()",
					name, events, update_of, table, fs_ext_schema(), function),
		   0, NULL, NULL, NULL, false);
	fs_spi(psprintf("CREATE TRIGGER %s AFTER TRUNCATE ON %s"
					" FOR EACH STATEMENT EXECUTE FUNCTION %s.fs_fair_truncate_trigger('%s')",
					truncate_name, table, fs_ext_schema(), role),
		   0, NULL, NULL, NULL, false);
}

/* A TRUNCATE trigger alone, on a partition below a table with the row trigger. */
static void
fs_create_truncate_trigger(const char *table, const char *truncate_name, const char *role)
{
	fs_spi(psprintf("CREATE TRIGGER %s AFTER TRUNCATE ON %s"
					" FOR EACH STATEMENT EXECUTE FUNCTION %s.fs_fair_truncate_trigger('%s')",
					truncate_name, table, fs_ext_schema(), role),
		   0, NULL, NULL, NULL, false);
}

/* What fs_sync_triggers() learns of one table of a partition tree. */
typedef struct FsTriggerHome
{
	Oid			relid;
	bool		ready;			/* some registration's ready table */
	bool		running;		/* some registration's running table */
} FsTriggerHome;

/*
 * The registrations of the tables in `relids` (ready and running tables),
 * rows of (queue, ready_table, running_table, tenant, ready_filter, key,
 * cost, running_filter, running_key, subkey), in SPI_tuptable.
 */
static void
fs_registrations_of(List *relids)
{
	Datum	   *elems = palloc(sizeof(Datum) * list_length(relids));
	Oid			argtypes[1] = {OIDARRAYOID};
	Datum		values[1];
	ListCell   *lc;
	int			i = 0;

	foreach(lc, relids)
		elems[i++] = ObjectIdGetDatum(lfirst_oid(lc));
	values[0] = PointerGetDatum(construct_array(elems, i, OIDOID, sizeof(Oid), true, TYPALIGN_INT));
	fs_spi(psprintf("SELECT queue, ready_table::pg_catalog.oid, running_table::pg_catalog.oid,"
					" tenant, ready_filter, key, cost, running_filter, running_key, subkey, order_by"
					"  FROM %s.fs_fair_queues"
					" WHERE ready_table::pg_catalog.oid = ANY ($1)"
					"    OR running_table::pg_catalog.oid = ANY ($1)",
					fs_ext_schema()),
		   1, argtypes, values, NULL, false);
}

/*
 * The tables of `relid`'s partition tree (the table alone if it is in
 * none), each with whether a registration's ready or running table it is;
 * the registrations are left in SPI_tuptable (fs_registrations_of()).
 *
 * The whole tree is locked ACCESS EXCLUSIVE first, top down as queries
 * lock it (so that dropping triggers bottom up cannot deadlock with them),
 * and the registrations are read after: a registration of another table
 * of the tree, made meanwhile, has committed or waits for this one.
 */
static FsTriggerHome *
fs_trigger_tree(Oid relid, int *ntables)
{
	Oid			root = relid;
	List	   *ancestors;
	List	   *tree;
	FsTriggerHome *homes;
	ListCell   *lc;
	int			t = 0;

	/* None for a partition being detached concurrently: it stands alone. */
	ancestors = get_rel_relispartition(relid) ? get_partition_ancestors(relid) : NIL;
	if (ancestors != NIL)
		root = llast_oid(ancestors);
	LockRelationOid(root, AccessExclusiveLock);
	tree = get_rel_relkind(root) == RELKIND_PARTITIONED_TABLE ?
		find_all_inheritors(root, AccessExclusiveLock, NULL) : list_make1_oid(root);
	homes = palloc0(sizeof(FsTriggerHome) * list_length(tree));
	fs_registrations_of(tree);
	foreach(lc, tree)
	{
		uint64		r;

		homes[t].relid = lfirst_oid(lc);
		for (r = 0; r < SPI_processed; r++)
		{
			bool		isnull;
			Datum		ready = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2, &isnull);
			Datum		running;

			if (!isnull && DatumGetObjectId(ready) == homes[t].relid)
				homes[t].ready = true;
			running = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 3, &isnull);
			if (!isnull && DatumGetObjectId(running) == homes[t].relid)
				homes[t].running = true;
		}
		t++;
	}
	*ntables = t;
	return homes;
}

/*
 * Make the row and TRUNCATE triggers of a home (`ready_home`,
 * `running_home`: of which kind), reading the columns of the registrations
 * in `regs` (nregs rows of fs_registrations_of()) whose table is the home
 * or below it, and the TRUNCATE triggers of the partitions below it.
 */
static void
fs_make_home_triggers(Oid home, bool ready_home, bool running_home, SPITupleTable *regs,
					  uint64 nregs)
{
	List	   *below;
	Bitmapset  *ready_cols = NULL;
	Bitmapset  *running_cols = NULL;
	Relation	rel;
	const char *table;
	const char *ready_of;
	const char *running_of;
	ListCell   *lc;
	uint64		r;

	below = get_rel_relkind(home) == RELKIND_PARTITIONED_TABLE ?
		find_all_inheritors(home, AccessExclusiveLock, NULL) : list_make1_oid(home);
	rel = relation_open(home, AccessShareLock);
	for (r = 0; r < nregs; r++)
	{
		HeapTuple	tuple = regs->vals[r];
		TupleDesc	desc = regs->tupdesc;
		char	   *queue = SPI_getvalue(tuple, desc, 1);
		bool		isnull;
		Datum		ready = SPI_getbinval(tuple, desc, 2, &isnull);
		Datum		running;

		if (ready_home && !isnull && list_member_oid(below, DatumGetObjectId(ready)))
		{
			Oid			own_relid = DatumGetObjectId(ready);
			Relation	own = own_relid == home ? rel : relation_open(own_relid, AccessShareLock);

			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 4), rel, own, FS_EXPR_TENANT, queue);
			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 5), rel, own, FS_EXPR_FILTER, queue);
			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 6), rel, own, FS_EXPR_KEY, queue);
			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 7), rel, own, FS_EXPR_COST, queue);
			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 10), rel, own, FS_EXPR_SUBKEY, queue);
			/*
			 * The order too: a row moved within its tenant's order tells
			 * the probe starts it may now sort below (probe_start.c).
			 */
			fs_add_columns_of(&ready_cols, SPI_getvalue(tuple, desc, 11), rel, own, FS_EXPR_ORDER, queue);
			if (own != rel)
				relation_close(own, NoLock);
		}
		running = SPI_getbinval(tuple, desc, 3, &isnull);
		if (running_home && !isnull && list_member_oid(below, DatumGetObjectId(running)))
		{
			Oid			own_relid = DatumGetObjectId(running);
			Relation	own = own_relid == home ? rel : relation_open(own_relid, AccessShareLock);

			fs_add_columns_of(&running_cols, SPI_getvalue(tuple, desc, 8), rel, own,
							  FS_EXPR_RUNNING_FILTER, queue);
			fs_add_columns_of(&running_cols, SPI_getvalue(tuple, desc, 9), rel, own,
							  FS_EXPR_RUNNING_KEY, queue);
			if (own != rel)
				relation_close(own, NoLock);
		}
	}
	ready_of = fs_update_of(ready_cols, rel);
	running_of = fs_update_of(running_cols, rel);
	table = fs_qualified_name(home);
	/* DDL on the table needs it closed (it stays locked). */
	relation_close(rel, NoLock);

	if (ready_home)
		fs_create_triggers(table, FS_TRIGGER_READY, "INSERT OR DELETE OR UPDATE", ready_of,
						   "fs_fair_ready_trigger", FS_TRIGGER_READY_T, "ready");
	if (running_home)
		fs_create_triggers(table, FS_TRIGGER_RUN, "DELETE OR UPDATE", running_of,
						   "fs_fair_running_trigger", FS_TRIGGER_RUN_T, "running");
	/*
	 * A TRUNCATE of one partition of a ready table has its queues recounted.
	 * Not of a running table: its trigger releases every lease of the
	 * queue, and the other partitions' jobs still run (a TRUNCATE of the
	 * home fires the home's).  PostgreSQL refuses TRUNCATE triggers on
	 * foreign tables.
	 */
	foreach(lc, below)
	{
		Oid			part = lfirst_oid(lc);

		if (part != home && ready_home && get_rel_relkind(part) != RELKIND_FOREIGN_TABLE)
			fs_create_truncate_trigger(fs_qualified_name(part), FS_TRIGGER_READY_T, "ready");
	}
}

/*
 * Make the fairshare triggers of `relid`'s table, and of every table of its
 * partition tree, match the registrations that use them.
 *
 * A ready table's row trigger fires on INSERT, DELETE and UPDATE of the
 * columns any registration's tenant, filter, key or cost reads; a running
 * table's on DELETE and UPDATE of the columns of running_filter and
 * running_key; each has a TRUNCATE trigger.  In a partition tree, a row
 * trigger on a table is cloned to all its partitions, present and future,
 * and its function serves the registrations of the partition and of its
 * ancestors (fs_fair_rel_triggers()).  So a row fires one trigger only if
 * the row triggers live on the topmost registered tables alone (their
 * "homes"), each reading the columns of its own registrations and of its
 * registered partitions', and registered partitions below a home have none
 * of their own.  TRUNCATE triggers are not cloned: every partition of a
 * ready table's home gets its own (a partition made later has none until
 * the next registration; the periodic recount corrects its queue's
 * backlog).
 *
 * Every own trigger of the tree is dropped first, bottom up (a parent's
 * takes its clones with it), then the homes' are made.
 */
void
fs_sync_triggers(Oid relid)
{
	FsTriggerHome *homes;
	SPITupleTable *regs;
	uint64		nregs;
	int			ntables;
	int			t;
	int			u;
	int			nest;

	if (get_rel_name(relid) == NULL)
		return;					/* dropped: its triggers went with it */
	/*
	 * A distributed table's triggers are the coordinator's to change (a
	 * drop of the table fires this node's own cleanup too).
	 */
	if (fs_cluster_ddl_is_coordinators(relid))
		return;

	/*
	 * Citus copies a distributed table's triggers to its shards, where the
	 * rows are, only when told that triggers are wanted there.
	 */
	nest = fs_search_path_begin();
	if (fs_cluster_is_distributed(relid))
		(void) set_config_option("citus.enable_unsafe_triggers", "on", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	homes = fs_trigger_tree(relid, &ntables);
	regs = SPI_tuptable;
	nregs = SPI_processed;

	for (t = ntables - 1; t >= 0; t--)
	{
		fs_drop_trigger(homes[t].relid, FS_TRIGGER_READY, "fs_fair_ready_trigger");
		fs_drop_trigger(homes[t].relid, FS_TRIGGER_READY_T, "fs_fair_truncate_trigger");
		fs_drop_trigger(homes[t].relid, FS_TRIGGER_RUN, "fs_fair_running_trigger");
		fs_drop_trigger(homes[t].relid, FS_TRIGGER_RUN_T, "fs_fair_truncate_trigger");
	}

	for (t = 0; t < ntables; t++)
	{
		List	   *above = get_rel_relispartition(homes[t].relid) ?
			get_partition_ancestors(homes[t].relid) : NIL;
		bool		ready_home = homes[t].ready;
		bool		running_home = homes[t].running;

		/* A home has no registered table above it. */
		for (u = 0; u < ntables; u++)
			if (list_member_oid(above, homes[u].relid))
			{
				ready_home &= !homes[u].ready;
				running_home &= !homes[u].running;
			}
		if (ready_home || running_home)
			fs_make_home_triggers(homes[t].relid, ready_home, running_home, regs, nregs);
	}
	fs_search_path_end(nest);
}
