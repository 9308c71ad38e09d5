/* fairshare 0.4.0 -> 0.5.0: least privilege by default */

\echo Use "ALTER EXTENSION fairshare UPDATE TO '0.5.0'" to load this file. \quit
