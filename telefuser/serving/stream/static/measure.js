// What the page measures, the same way for both transports (PROTOCOL.md, "Measuring control-to-display"):
//   control-to-display  every control the page sends carries its own `seq`; every chunk carries the `control_seq` of
//                       the held keys it was computed under; the latency of control s is the time from sending it to
//                       drawing the first frame computed under s or a later control (performance.now() clocks).
//   chunk interval      gaps between chunk arrivals;   displayed FPS  frames drawn / time from the first to the last
//   held frames         frames received and not yet drawn (the page's buffer), its maximum against the announced one
//   bytes               media bytes received (WebSocket: chunk envelopes; WebRTC: the inbound RTP stream's bytes)
//   transport overhead  per chunk (PROTOCOL.md, "Measuring the transport overhead"): from the server's `computed_at`
//                       (wall clock, epoch ms, the model's chunk ready, before encoding) to the animation frame at
//                       which the page could first draw the chunk's first frame (epoch ms: performance.timeOrigin +
//                       performance.now()), minus the WebRTC track's pacing wait (`paced_ms`); the wait in the page's
//                       own playout buffer is not in it (WebSocket: the frame is ready once decoded and queued)
"use strict";
window.TF = window.TF || {};
TF.percentile = (values, q) => {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
};

// transport overhead of one chunk: displayable (epoch ms) - computed (epoch ms) - the pacing wait (ms)
TF.overheadMs = (computedAt, displayableAt, pacedMs = 0) => displayableAt - computedAt - pacedMs;

TF.Measure = class {
  constructor() {
    this.pending = new Map(); // seq -> {t, keys}
    this.latencies = []; // {seq, keys, ms, chunk}
    this.arrivals = []; // chunk arrival times
    this.draws = 0;
    this.recentDraws = []; // draw times of the last second: the playback FPS shown
    this.firstDraw = null;
    this.lastDraw = null;
    this.heldMax = 0;
    this.bytes = 0;
    this.firstByteAt = null;
    this.lastByteAt = null;
    this.computeFps = []; // frames / compute seconds, per chunk
    this.stalls = 0; // times playback ran out of frames before the stream ended
    this.stalledMs = 0;
    this.stalledAt = null;
    this.overheads = []; // {chunk, ms, paced_ms}: transport overhead per chunk
    this.overheadChunks = new Set();
    this.clockOffsetMs = Date.now() - (performance.timeOrigin + performance.now()); // wall clock vs. the page's
  }

  // The first frame of `chunk`, which the server computed at `computedAt` (epoch ms), could be drawn at `t`
  // (performance.now()); `pacedMs`: how long the server's track held it for its due time (WebRTC; 0 on the WebSocket).
  transported(chunk, computedAt, t, pacedMs = 0) {
    if (typeof computedAt !== "number" || this.overheadChunks.has(chunk)) return;
    this.overheadChunks.add(chunk);
    const paced = typeof pacedMs === "number" ? pacedMs : 0;
    this.overheads.push({ chunk, ms: TF.overheadMs(computedAt, performance.timeOrigin + t, paced), paced_ms: paced });
  }

  // playback ran dry (true) or resumed (false)
  stalled(dry, t) {
    if (dry) { this.stalls += 1; this.stalledAt = t; } else if (this.stalledAt !== null) {
      this.stalledMs += t - this.stalledAt;
      this.stalledAt = null;
    }
  }

  pressed(seq, keys, t) { this.pending.set(seq, { t, keys }); }

  chunkArrived(t, bytes) {
    this.arrivals.push(t);
    this.received(bytes, t);
  }

  received(bytes, t) {
    if (this.firstByteAt === null) this.firstByteAt = t;
    this.lastByteAt = t;
    this.bytes += bytes;
  }

  computed(frames, seconds) { if (seconds > 0) this.computeFps.push(frames / seconds); }

  held(frames) { this.heldMax = Math.max(this.heldMax, frames); }

  // A frame computed under control `seq` (null: under no control of this page) is on screen at t.
  drawn(seq, chunk, t) {
    this.draws += 1;
    if (this.firstDraw === null) this.firstDraw = t;
    this.lastDraw = t;
    this.recentDraws.push(t);
    if (seq === null || seq === undefined) return;
    for (const [s, press] of this.pending) {
      if (s > seq) continue;
      this.latencies.push({ seq: s, keys: press.keys, ms: t - press.t, chunk });
      this.pending.delete(s);
    }
  }

  playbackFps(now) {
    while (this.recentDraws.length && now - this.recentDraws[0] > 1000) this.recentDraws.shift();
    return this.recentDraws.length;
  }

  // the model's own speed: frames per compute second over the last chunks (the first one warms up)
  generationFps() {
    const recent = this.computeFps.slice(Math.max(1, this.computeFps.length - 4));
    return recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : null;
  }

  summary() {
    const ms = this.latencies.map((l) => l.ms);
    const gaps = this.arrivals.slice(1).map((t, i) => t - this.arrivals[i]);
    const playSeconds = this.draws > 1 ? (this.lastDraw - this.firstDraw) / 1000 : null;
    const byteSeconds = this.lastByteAt !== null ? (this.lastByteAt - this.firstByteAt) / 1000 : 0;
    const steady = this.computeFps.slice(1);
    const overhead = this.overheads.map((o) => o.ms);
    const paced = this.overheads.map((o) => o.paced_ms);
    return {
      controls: this.latencies.length,
      pending_controls: this.pending.size,
      latency_records: this.latencies.map((l) => ({ ...l, ms: Math.round(l.ms) })),
      latency_p50_ms: TF.percentile(ms, 0.5),
      latency_p95_ms: TF.percentile(ms, 0.95),
      chunks: this.arrivals.length,
      chunk_interval_p50_ms: TF.percentile(gaps, 0.5),
      chunk_interval_mean_ms: gaps.length ? gaps.reduce((a, b) => a + b, 0) / gaps.length : null,
      frames_drawn: this.draws,
      displayed_fps: playSeconds ? (this.draws - 1) / playSeconds : null,
      held_max_frames: this.heldMax,
      stalls: this.stalls,
      stalled_ms: Math.round(this.stalledMs),
      bytes: this.bytes,
      bytes_per_s: byteSeconds > 0 ? this.bytes / byteSeconds : null,
      generation_fps: steady.length ? TF.percentile(steady, 0.5) : TF.percentile(this.computeFps, 0.5),
      overhead_chunks: overhead.length,
      overhead_p50_ms: TF.percentile(overhead, 0.5),
      overhead_p95_ms: TF.percentile(overhead, 0.95),
      overhead_records: this.overheads.map((o) => ({ ...o, ms: Math.round(o.ms * 10) / 10 })),
      pacing_wait_p50_ms: TF.percentile(paced, 0.5),
      pacing_wait_p95_ms: TF.percentile(paced, 0.95),
      clock_offset_ms: Math.round(this.clockOffsetMs * 10) / 10,
    };
  }
};
