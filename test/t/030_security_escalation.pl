# A table owner must not become superuser through fairshare.
#
# Role app owns app.jobs, registered for fair dequeue by a superuser.  app
# then plants code that fairshare runs: a row-level security policy (FORCE)
# whose function leaks a session-level search_path (set_config(..., false),
# also from a function with a SET clause), and app.now() that makes app a
# superuser when it runs with superuser rights.  Whoever triggers fairshare's
# work afterwards (fs_resync, the background worker's recount, the first
# fs_claim after a restart, a superuser's write that fires fairshare's
# triggers, a registration) must come back with its own settings, and app
# must stay an ordinary role.  Variants try the other ways code can outlive
# its turn: SET ROLE / SET SESSION AUTHORIZATION, temporary domains and
# functions, operators in public.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FairshareTest;

my $t0 = 1704067200;    # 2024-01-01 00:00:00 UTC
my $node = fs_node('security', qq{
fairshare.debug_clock = $t0
log_min_messages = log
});
my $q = sub { $node->safe_psql('postgres', shift) };

$q->(q{
	CREATE ROLE app LOGIN;
	GRANT CREATE ON SCHEMA public TO app;
	CREATE SCHEMA app AUTHORIZATION app;
	SET ROLE app;
	CREATE TABLE app.jobs (id bigint PRIMARY KEY, tenant text NOT NULL, weight float8 NOT NULL DEFAULT 1);
	CREATE TABLE app.audit (what text, search_path text, is_superuser text);
	INSERT INTO app.jobs SELECT i, 't' || (i % 3) FROM generate_series(1, 30) i;
	-- Escalation payload: as a superuser, make app one.
	CREATE FUNCTION app.payload() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
			EXECUTE 'ALTER ROLE app SUPERUSER';
		END IF;
		RETURN true;
	END $$;
	CREATE FUNCTION app.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM app.payload();
		RETURN pg_catalog.now();
	END $$;
	-- Leaks: a session-level search_path that puts app first.
	CREATE FUNCTION app.evil() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_catalog.set_config('search_path', 'app, pg_catalog', false);
		RETURN true;
	END $$;
	CREATE FUNCTION app.evil_proconfig() RETURNS boolean LANGUAGE plpgsql
		SET search_path = app, pg_catalog AS $$
	BEGIN
		PERFORM pg_catalog.set_config('search_path', 'app, pg_catalog', false);
		PERFORM pg_catalog.set_config('work_mem', '1234kB', false);
		RETURN true;
	END $$;
	RESET ROLE;
});

my $register = q{SELECT queue FROM fs_register_queue('appq', 'app.jobs', tenant => 'tenant', order_by => 'id')};
$q->($register);
$q->("SELECT fs_set_limit('*', 'appq', max_slots => 100)");

# Plant the policy only after registration (as the owner may at any time).
$q->(q{
	SET ROLE app;
	ALTER TABLE app.jobs ENABLE ROW LEVEL SECURITY;
	ALTER TABLE app.jobs FORCE ROW LEVEL SECURITY;
	CREATE POLICY everything ON app.jobs USING (app.evil() AND app.evil_proconfig());
	RESET ROLE;
});

my $default_path = $q->('SHOW search_path');
my $not_super = sub {
	my ($what) = @_;
	is($q->("SELECT rolsuper FROM pg_roles WHERE rolname = 'app'"), 'f', "$what: app is not a superuser");
};

# What a session shows after the step: its search_path, a setting the
# owner's code tried to change, and whether now() is still pg_catalog's.
my $after = q{
	SELECT current_setting('search_path') || ' | ' || current_setting('work_mem') || ' | ' ||
	       current_user || ' | ' || session_user;
	SELECT now() IS NOT NULL;
};
my $expect = "$default_path | 4MB | postgres | postgres\nt";

# 1. fs_resync by a superuser.
is($q->("SELECT ready_rows FROM fs_resync('appq'); $after"), "30\n$expect",
	'fs_resync: counted, the caller\'s settings are its own afterwards');
$not_super->('fs_resync');

# fs_resync(NULL): every queue, each in a subtransaction.
is($q->("SELECT count(*) FROM fs_resync(); $after"), "1\n$expect",
	'fs_resync(NULL): the caller\'s settings are its own afterwards');
$not_super->('fs_resync(NULL)');

# 2. The first fs_claim after a restart recounts the queue (no scheduler,
# so that the claim is what recounts).
$q->("ALTER SYSTEM SET fairshare.database = ''");
$node->restart;
is($q->("SELECT count(*) FROM fs_claim('appq', NULL::app.jobs, 2); $after"), "2\n$expect",
	'first fs_claim after a restart: claimed, settings unchanged');
$not_super->('fs_claim after a restart');

# 3. The background worker: it recounts at start and every resync_interval,
# then runs the commands of the pass; a superuser's command calls now().
$q->(q{
	CREATE TABLE worker_saw (search_path text, is_superuser text);
	SELECT fs_schedule('probe', '* * * * *',
	       command => $$INSERT INTO public.worker_saw SELECT current_setting('search_path'), current_setting('is_superuser'); SELECT now()$$);
});
$q->("ALTER SYSTEM RESET fairshare.database; ALTER SYSTEM SET fairshare.resync_interval = 0");
$node->restart;    # the scheduler recounts as it starts
my $at = $t0 + 120;
$q->("ALTER SYSTEM SET fairshare.debug_clock = $at; SELECT pg_reload_conf()");
$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM worker_saw")
  or die "the scheduler did not run the probe";
is($q->("SELECT resyncs > 0 FROM fs_fairness WHERE queue = 'appq'"), 't', 'the worker recounted the queue');
is($q->("SELECT search_path FROM worker_saw LIMIT 1"), '"$user", public',
	'the worker\'s next command runs with its own search_path, not the one the owner\'s code set');
$not_super->('the worker\'s recount and next command');
$q->("SELECT fs_unschedule('probe')");

# 4. A superuser's write fires fairshare's triggers: a registered cost
# expression that calls the owner's function runs as the owner, read-only.
$q->(q{
	SET ROLE app;
	CREATE FUNCTION app.cost_of(w float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		PERFORM pg_catalog.set_config('search_path', 'app, pg_catalog', false);
		PERFORM app.payload();
		RETURN w;
	END $$;
	CREATE TABLE app.jobs2 (id bigint PRIMARY KEY, tenant text NOT NULL, w float8 NOT NULL DEFAULT 1);
	RESET ROLE;
	SELECT queue FROM fs_register_queue('appq2', 'app.jobs2', tenant => 'tenant', order_by => 'id',
	                                    cost => 'app.cost_of(w)');
});
is($q->(q{INSERT INTO app.jobs2 SELECT i, 'x' FROM generate_series(1, 5) i;
	UPDATE app.jobs2 SET tenant = 'y' WHERE id = 1; DELETE FROM app.jobs2 WHERE id = 2;} . $after),
	$expect, 'a superuser\'s writes: settings unchanged');
$not_super->('triggers fired by a superuser\'s write');
is($q->("SELECT string_agg(tenant || '=' || ready_rows, ' ' ORDER BY tenant) FROM fs_tenants WHERE queue = 'appq2'"),
	'x=3 y=1', 'the triggers counted the rows');

# The owner's code cannot write while it runs as part of a count.
$q->(q{
	SET ROLE app;
	CREATE FUNCTION app.write_audit() RETURNS void LANGUAGE sql AS $$
		INSERT INTO app.audit VALUES ('cost_of', pg_catalog.current_setting('search_path'), pg_catalog.current_setting('is_superuser'))
	$$;
	CREATE OR REPLACE FUNCTION app.cost_of(w float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		PERFORM app.write_audit();
		RETURN w;
	END $$;
	RESET ROLE;
});
my ($rc, $out, $err) = $node->psql('postgres', "DELETE FROM app.jobs2 WHERE id = 3");
like($err, qr/cannot execute INSERT in a read-only transaction/, 'the owner\'s code is read-only in a trigger');
$q->(q{SET ROLE app;
	CREATE OR REPLACE FUNCTION app.cost_of(w float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		PERFORM app.payload();
		RETURN w;
	END $$;
	RESET ROLE;});
$q->("DELETE FROM app.jobs2 WHERE id = 4");
$not_super->('the owner\'s code called by a trigger');
is($q->("SELECT count(*) FROM app.audit"), '0', 'nothing was written');

# 5. Registration (again, with the policy in place) and a recount right after.
like($q->("$register; SELECT ready_rows FROM fs_resync('appq'); $after"), qr/^appq\n30\n\Q$expect\E$/,
	're-registration and recount: settings unchanged');
$not_super->('registration');

# --- Variants: other things code might leave behind ----------------------------

# SET ROLE / SET SESSION AUTHORIZATION from a policy: refused in a
# security-restricted operation, and the caller keeps its role.
$q->(q{
	SET ROLE app;
	CREATE FUNCTION app.become() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_catalog.set_config('role', 'app', false);
		RETURN true;
	END $$;
	CREATE FUNCTION app.become_session() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE 'SET SESSION AUTHORIZATION app';
		RETURN true;
	END $$;
	DROP POLICY everything ON app.jobs;
	CREATE POLICY everything ON app.jobs USING (app.become());
	RESET ROLE;
});
($rc, $out, $err) = $node->psql('postgres', "SELECT * FROM fs_resync('appq')");
like($err, qr/cannot set parameter "role" within security-/, 'SET ROLE is refused');
is($q->("SELECT count(*) FROM fs_resync(); $after"), "1\n$expect", 'role unchanged after a refused SET ROLE (the other queue recounted)');
$q->(q{SET ROLE app; ALTER POLICY everything ON app.jobs USING (app.become_session()); RESET ROLE;});
($rc, $out, $err) = $node->psql('postgres', "SELECT * FROM fs_resync('appq')");
like($err, qr/cannot set parameter "session_authorization" within security-/,
	'SET SESSION AUTHORIZATION is refused');
$not_super->('SET ROLE attempts');

# Temporary objects: a temporary domain named like a pg_catalog type (the
# temporary schema is searched first for types), or a temporary function.
# The caller's session already has a temporary schema.
$q->(q{
	SET ROLE app;
	CREATE FUNCTION app.escalate(v text) RETURNS boolean LANGUAGE sql AS $$ SELECT app.payload() $$;
	CREATE FUNCTION app.plant_temp() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE 'CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (app.escalate(VALUE))';
		RETURN true;
	END $$;
	ALTER POLICY everything ON app.jobs USING (app.plant_temp());
	RESET ROLE;
});
($rc, $out, $err) = $node->psql('postgres', q{
	CREATE TEMP TABLE mine (x int);
	SELECT * FROM fs_resync('appq');
});
like($err, qr/cannot execute CREATE DOMAIN in a read-only transaction/, 'no temporary domain from a recount');

# A temporary operator, and a temporary function, planted the same way.
$q->(q{
	SET ROLE app;
	CREATE OR REPLACE FUNCTION app.plant_temp() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE 'CREATE FUNCTION pg_temp.evil_eq(a text, b text) RETURNS boolean LANGUAGE sql AS $f$ SELECT app.payload() $f$';
		EXECUTE 'CREATE OPERATOR pg_temp.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_temp.evil_eq)';
		RETURN true;
	END $$;
	RESET ROLE;
});
($rc, $out, $err) = $node->psql('postgres', q{
	CREATE TEMP TABLE mine (x int);
	SELECT * FROM fs_resync('appq');
});
like($err, qr/cannot execute CREATE FUNCTION in a read-only transaction/, 'no temporary function or operator from a recount');
is($q->(q{CREATE TEMP TABLE mine (x int); SELECT count(*) FROM pg_proc WHERE pronamespace = pg_my_temp_schema();}),
	'0', 'nothing was left in the temporary schema');
$q->(q{SET ROLE app;
	CREATE OR REPLACE FUNCTION app.plant_temp() RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE 'CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (app.escalate(VALUE))';
		RETURN true;
	END $$;
	RESET ROLE;});
is($q->(q{CREATE TEMP TABLE mine (x int); SELECT count(*) FROM fs_resync(); SELECT 'abc'::text; } . $after),
	"1\nabc\n$expect", 'no temporary type shadows pg_catalog\'s afterwards');
$not_super->('temporary objects');

# Operators and functions in public, where app may create: fairshare's own
# queries resolve only pg_catalog names.
$q->(q{
	SET ROLE app;
	CREATE FUNCTION public.text_eq_evil(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM app.payload();
		RETURN a OPERATOR(pg_catalog.=) b;
	END $$;
	CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.text_eq_evil);
	CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT app.now() $$;
	CREATE FUNCTION public.count(anyelement) RETURNS bigint LANGUAGE plpgsql AS $$
	BEGIN PERFORM app.now(); RETURN 0; END $$;
	-- an implicit cast from a type of app's to text, through app's code
	CREATE TYPE app.label AS ENUM ('t0', 't1', 't2');
	CREATE FUNCTION app.label_text(app.label) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN PERFORM app.payload(); RETURN $1::name::text; END $$;
	DROP POLICY everything ON app.jobs;
	CREATE POLICY everything ON app.jobs USING (true);
	RESET ROLE;
	CREATE CAST (app.label AS text) WITH FUNCTION app.label_text(app.label) AS IMPLICIT;
	SET search_path = public, pg_catalog;
});
is($q->(q{SET search_path = public, "$user";
	SELECT ready_rows FROM fs_resync('appq');
	SELECT count(*) FROM fs_claim('appq', NULL::app.jobs, 3);
	SELECT count(*) > 0 FROM fs_ready_tenants('appq');
	INSERT INTO app.jobs VALUES (1000, 't1');
	SELECT count(*) FROM fs_schedule_status;}),
	"30\n3\nt\n0", 'fairshare\'s queries work with app\'s operators, functions and casts in the caller\'s path');
$not_super->('operators, functions and casts in public');

# The server log shows no crash.
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no backend crashed');
$node->stop;
done_testing();
