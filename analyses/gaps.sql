-- gaps: the collectives of a run (what ran during each exposed interval).
-- $run: run id. bytes = the larger of input and output size (all_gather: the gathered buffer).
-- Only the rows of the communication activity itself (NCCL kernels, gloo work), not other records
-- of the same collectives (e.g. Flight Recorder entries).
SELECT rank, coalesce(step, -1) AS step_key, start_ns, end_ns, op, pg, seq,
       CASE WHEN bytes_in IS NULL AND bytes_out IS NULL THEN NULL
            ELSE greatest(coalesce(bytes_in, 0), coalesce(bytes_out, 0)) END AS bytes
FROM collectives
WHERE run_id = $run AND source IN ('nccl_kernel', 'gloo') AND end_ns > start_ns;
-- ops: CPU ops and annotations on the threads that launched or ran the compute before a gap.
-- $traces, $tids: candidate trace ids and thread ids (the exact pairs are kept in polars).
-- Not a flagged record (a clipped overrun or unclosed op's extent is made up: it would enclose
-- everything after it) and not a communication op (a collective's enqueue: gloo work, c10d ops,
-- record_param_comms): the compute before a gap is never a collective.
SELECT trace_id, tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, name
FROM events
WHERE run_id = $run AND kind IN ('cpu_op', 'user_annotation') AND dur_ns > 0 AND flag IS NULL
  AND NOT starts_with(name, 'gloo:') AND NOT starts_with(name, 'c10d::') AND name <> 'record_param_comms'
  AND trace_id IN ($traces) AND tid IN ($tids)
;
-- collectives with their device: as the first statement, for a run where a process drives several
-- GPUs (a stream number recurs on every device: the kernel with the same start and stream on the
-- same trace gives the device).
SELECT c.rank, coalesce(c.step, -1) AS step_key, c.start_ns, c.end_ns, c.op, c.pg, c.seq,
       CASE WHEN c.bytes_in IS NULL AND c.bytes_out IS NULL THEN NULL
            ELSE greatest(coalesce(c.bytes_in, 0), coalesce(c.bytes_out, 0)) END AS bytes,
       k.device
FROM collectives c
LEFT JOIN (SELECT DISTINCT run_id, rank, trace_id, stream, ts_ns, device FROM kernels
           WHERE run_id = $run AND class = 'comm') k
  ON k.run_id = c.run_id AND k.rank = c.rank AND k.trace_id = c.trace_id AND k.stream = c.stream
 AND k.ts_ns = c.start_ns
WHERE c.run_id = $run AND c.source IN ('nccl_kernel', 'gloo') AND c.end_ns > c.start_ns
