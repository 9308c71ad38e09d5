-- pgTAP: least privilege by default.  PUBLIC executes no function that
-- decides or configures; fairshare_app decides, fairshare_worker reports,
-- fairshare_admin configures (and is both others); a lease is released or
-- renewed only by its owner, a role with the owner's privileges,
-- fairshare_admin or a superuser.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS fairshare;
BEGIN;
SELECT plan(74);

-- The roles.
SELECT has_role('fairshare_app');
SELECT has_role('fairshare_worker');
SELECT has_role('fairshare_admin');
SELECT is_member_of('fairshare_app', 'fairshare_admin');
SELECT is_member_of('fairshare_worker', 'fairshare_admin');
SELECT isnt(shobj_description(oid, 'pg_authid'), NULL, rolname || ' has a comment')
  FROM pg_roles WHERE rolname IN ('fairshare_app', 'fairshare_worker', 'fairshare_admin')
 ORDER BY rolname;
SELECT ok(NOT rolcanlogin, rolname || ' cannot log in')
  FROM pg_roles WHERE rolname IN ('fairshare_app', 'fairshare_worker', 'fairshare_admin')
 ORDER BY rolname;

-- Who executes what: PUBLIC nothing of these, each role its part.
CREATE TEMP TABLE fn (sig text, grantee text);
INSERT INTO fn VALUES
    ('fs_acquire_slot(text,text,interval)', 'fairshare_app'),
    ('fs_release_slot(bigint)', 'fairshare_app'),
    ('fs_renew_slot(bigint,interval)', 'fairshare_app'),
    ('fs_spend_tokens(text,integer,integer,text)', 'fairshare_app'),
    ('fs_charge_tokens(text,double precision,text)', 'fairshare_app'),
    ('fs_effective_limits(text,text)', 'fairshare_app'),
    ('fs_route_enqueue(text,text,jsonb,text)', 'fairshare_app'),
    ('fs_claim(text,anyelement,integer,interval,text[],text[])', 'fairshare_app'),
    ('fs_ready_tenants(text,integer)', 'fairshare_app'),
    ('fs_explain_wait(text,text)', 'fairshare_app'),
    ('fs_worker_heartbeat(text,integer,text)', 'fairshare_worker'),
    ('fs_report_latency(interval,text)', 'fairshare_worker'),
    ('fs_set_limit(text,text,integer,integer,double precision,double precision,double precision)', 'fairshare_admin'),
    ('fs_reset()', 'fairshare_admin'),
    ('fs_save_state()', 'fairshare_admin'),
    ('fs_register_queue(text,regclass,text,text,text,text,regclass,text,text,text,boolean,boolean,text,text,integer,interval,text)', 'fairshare_admin'),
    ('fs_unregister_queue(text)', 'fairshare_admin'),
    ('fs_resync(text)', 'fairshare_admin');
SELECT ok(NOT has_function_privilege('public', sig::regprocedure, 'EXECUTE'),
          'PUBLIC may not execute ' || sig) FROM fn ORDER BY sig;
SELECT ok(has_function_privilege(grantee, sig::regprocedure, 'EXECUTE'),
          grantee || ' may execute ' || sig) FROM fn ORDER BY sig;
SELECT ok(has_function_privilege('fairshare_admin', sig::regprocedure, 'EXECUTE'),
          'fairshare_admin may execute ' || sig || ' too') FROM fn WHERE grantee <> 'fairshare_admin' ORDER BY sig;
SELECT ok(NOT has_function_privilege('fairshare_app', sig::regprocedure, 'EXECUTE'),
          'fairshare_app may not execute ' || sig) FROM fn WHERE grantee <> 'fairshare_app' ORDER BY sig;

-- A lease belongs to the role that took it.
CREATE ROLE tap_owner IN ROLE fairshare_app;
CREATE ROLE tap_other IN ROLE fairshare_app;
CREATE ROLE tap_admin IN ROLE fairshare_admin;
SET LOCAL ROLE tap_owner;
SELECT fs_acquire_slot('tap_roles_t', 'tap_roles_q') AS lease \gset
RESET ROLE;
SELECT is((SELECT owner::text FROM fs_leases WHERE lease_id = :lease), 'tap_owner', 'fs_leases shows the owner');
SET LOCAL ROLE tap_other;
SELECT throws_ok('SELECT fs_release_slot(' || :lease || ')', '42501', NULL,
                 'another role may not release it');
SELECT throws_ok('SELECT fs_renew_slot(' || :lease || ')', '42501', NULL,
                 'another role may not renew it');
SELECT is(fs_release_slot(1), false, 'an unknown lease is false');
SET LOCAL ROLE tap_admin;
SELECT is(fs_renew_slot(:lease), true, 'fairshare_admin may renew it');
SET LOCAL ROLE tap_owner;
SELECT is(fs_renew_slot(:lease), true, 'its owner may renew it');
SELECT is(fs_release_slot(:lease), true, 'its owner may release it');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
