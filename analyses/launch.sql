-- launch: CPU launch -> GPU start latency, once per launch call, aggregated per rank, lane and step.
-- $run: run id; $short_ns: a kernel shorter than this is "short" (launch-bound).
-- Records flagged at ingest (before their own launch, far outside the steps) are left out.
WITH k AS (
  SELECT rank, device, stream, step, dur_ns, launch_ts_ns, first_of_launch,
         -- one latency per launch call: its first GPU activity (a CUDA graph launch starts many kernels)
         CASE WHEN first_of_launch THEN ts_ns - launch_ts_ns END AS latency_ns,
         launch_ts_ns IS NOT NULL AND (
           count(*) OVER (PARTITION BY trace_id, correlation) > 1 OR launch_name ILIKE '%GraphLaunch%'
         ) AS graph_kernel,
         -- the lane's latest end before this kernel: idle at launch when it ended before the launch
         max(end_ns) OVER (PARTITION BY rank, device, stream ORDER BY ts_ns, end_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
  FROM kernels
  WHERE run_id = $run AND kind = 'kernel' AND (flag IS NULL OR flag = 'overrun')
),
kk AS (
  SELECT *, first_of_launch AND launch_ts_ns >= coalesce(prev_end_ns, launch_ts_ns) AS idle_at_launch FROM k
)
SELECT grouping(stream) AS g_stream, grouping(step) AS g_step, rank, device, stream, step,
       count(*) AS kernels,
       count(launch_ts_ns) AS launched,
       count(latency_ns) AS launches,
       count(*) FILTER (graph_kernel AND first_of_launch) AS graph_launches,
       count(*) FILTER (graph_kernel) AS graph_kernels,
       -- statistics rounded to whole ns (interpolated percentiles and means are fractional)
       round(quantile_cont(latency_ns, 0.5))::BIGINT AS latency_p50_ns,
       round(quantile_cont(latency_ns, 0.9))::BIGINT AS latency_p90_ns,
       round(quantile_cont(latency_ns, 0.99))::BIGINT AS latency_p99_ns,
       max(latency_ns) AS latency_max_ns,
       round(avg(latency_ns))::BIGINT AS latency_mean_ns,
       count(*) FILTER (idle_at_launch) AS idle_launches,
       round(quantile_cont(latency_ns, 0.5) FILTER (idle_at_launch))::BIGINT AS idle_latency_p50_ns,
       count(*) FILTER (dur_ns < $short_ns) AS short_kernels,
       coalesce(sum(dur_ns) FILTER (dur_ns < $short_ns), 0)::BIGINT AS short_ns,
       sum(dur_ns)::BIGINT AS kernel_ns
FROM kk
GROUP BY GROUPING SETS ((rank), (rank, device, stream), (rank, step))
