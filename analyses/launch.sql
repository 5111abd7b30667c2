-- launch: CPU launch -> GPU start latency of every kernel, aggregated per rank, stream and step.
-- $run: run id; $short_ns: a kernel shorter than this is "short" (launch-bound).
WITH k AS (
  SELECT rank, stream, step, dur_ns,
         ts_ns - launch_ts_ns AS latency_ns,
         -- the stream's latest end before this kernel: idle at launch when it ended before the launch
         max(end_ns) OVER (PARTITION BY rank, stream ORDER BY ts_ns, end_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns,
         launch_ts_ns
  FROM kernels
  WHERE run_id = $run AND kind = 'kernel'
),
kk AS (
  SELECT *, launch_ts_ns >= coalesce(prev_end_ns, launch_ts_ns) AS idle_at_launch FROM k
)
SELECT grouping(stream) AS g_stream, grouping(step) AS g_step, rank, stream, step,
       count(*) AS kernels,
       count(latency_ns) AS launched,
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
GROUP BY GROUPING SETS ((rank), (rank, stream), (rank, step))
