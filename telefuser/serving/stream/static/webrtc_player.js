// The WebRTC transport: the page offers a receive-only video transceiver and a data channel ("tf") to the session's
// /webrtc route and plays the answer's video track in the <video> element; status events and client messages go over
// the data channel as the same JSON as on the WebSocket. The server's track paces the frames, so the page holds only
// the browser's jitter buffer and sends no playout reports.
//
// Which chunk a frame on screen came from: the server stamps each frame with its send time on the 90 kHz RTP clock,
// starting at 0, and announces each chunk's first frame (`chunk_playout`, with its `rtp_offset` and `control_seq`).
// requestVideoFrameCallback gives each presented frame's RTP timestamp; minus the first frame's, that is its offset.
// (The first frame is the stream's first keyframe; if it were lost, offsets would be off by what came before it.)
// The callback that presents a chunk's first frame (offset = its rtp_offset) ends that chunk's transport overhead:
// from its `computed_at`, less the `paced_ms` the server's track held it for its due time (measure.js).
"use strict";
window.TF = window.TF || {};

TF.RtcPlayer = class {
  constructor(video, measure, hooks) {
    Object.assign(this, { video, measure, hooks });
    this.kind = "webrtc";
    this.received = 0; // frames received (the inbound RTP stream's framesReceived)
    this.decoded = 0;
    this.drawn = 0; // frames presented
    this.chunks = 0;
    this.playing = false;
    this.done = false;
    this.fallbackOk = true; // until the server answered: the session has no consumer yet
    this.starts = []; // chunk_playout events, in order
    this.unplaced = []; // presented frames whose chunk was not announced yet: {offset, t}
    this.rtp0 = null;
    this.lastPresented = 0;
    this.bytes = 0;
    this.running = true;
  }

  get held() { return Math.max(0, this.received - this.drawn); }

  async connect(path, authFetch, fps, iceServers = []) {
    this.fps = fps;
    const pc = new RTCPeerConnection({ iceServers });
    this.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel("tf", { ordered: true });
    this.channel = channel;
    channel.onopen = () => this.hooks.onOpen();
    channel.onmessage = (e) => this.onMessage(JSON.parse(e.data));
    channel.onclose = () => { if (this.running) this.hooks.onClosed(0, "data channel closed"); };
    pc.ontrack = (e) => {
      this.video.srcObject = e.streams[0] || new MediaStream([e.track]);
      this.video.play().catch((err) => this.hooks.log(`video play: ${err}`, "error"));
      this.video.requestVideoFrameCallback((now, meta) => this.presented(now, meta));
    };
    await pc.setLocalDescription(await pc.createOffer());
    await gatheringComplete(pc, 3000);
    const r = await authFetch(path, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp }),
    });
    const reply = await r.json();
    if (!r.ok) throw new Error(`offer refused, ${r.status}: ${reply.detail}`);
    this.fallbackOk = false; // the session streams over this connection now
    const opened = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the WebRTC connection did not open within 15 s")), 15000);
      channel.addEventListener("open", () => { clearTimeout(timer); resolve(); });
      pc.addEventListener("connectionstatechange", () => {
        if (pc.connectionState === "failed") { clearTimeout(timer); reject(new Error("the WebRTC connection failed")); }
      });
    });
    await pc.setRemoteDescription(reply);
    this.stats = setInterval(() => this.poll(), 500);
    await opened;
  }

  configure() {}

  send(obj) {
    if (this.channel && this.channel.readyState === "open") { this.channel.send(JSON.stringify(obj)); return true; }
    return false;
  }

  close() {
    this.running = false;
    clearInterval(this.stats);
    if (this.pc) this.pc.close();
    this.video.srcObject = null;
  }

  onMessage(ev) {
    if (ev.stage === "chunk_playout") {
      this.starts.push(ev);
      this.chunks = ev.chunk + 1;
      this.measure.chunkArrived(performance.now(), 0);
      const waiting = this.unplaced;
      this.unplaced = [];
      for (const f of waiting) this.place(f.offset, f.t);
      return;
    }
    this.hooks.onEvent(ev);
  }

  // a frame is on screen: find its chunk by its RTP offset
  presented(now, meta) {
    if (!this.running) return;
    this.video.requestVideoFrameCallback((t, m) => this.presented(t, m));
    if (this.rtp0 === null) this.rtp0 = meta.rtpTimestamp;
    const offset = (meta.rtpTimestamp - this.rtp0) >>> 0;
    this.drawn = meta.presentedFrames;
    this.lastPresented = now;
    if (!this.playing) { this.playing = true; this.measure.stalled(false, now); this.hooks.onPlaying(true); }
    this.place(offset, now);
  }

  // A chunk's frames are sent one interval apart from its announced offset, so a frame past its last chunk's
  // frames belongs to a chunk whose announcement is still on its way: it waits for it.
  place(offset, t) {
    const ticks = 90000 / this.fps;
    let chunk = null;
    for (const s of this.starts) { if (s.rtp_offset <= offset + ticks / 2) chunk = s; else break; }
    if (!chunk || offset > chunk.rtp_offset + (chunk.frames - 1) * ticks + ticks / 2) {
      this.unplaced.push({ offset, t });
      while (this.unplaced.length > 256) this.unplaced.shift();
      return;
    }
    if (Math.abs(offset - chunk.rtp_offset) <= ticks / 2) this.measure.transported(chunk.chunk, chunk.computed_at, t, chunk.paced_ms);
    this.measure.drawn(chunk.control_seq, chunk.chunk, t);
  }

  async poll() {
    const now = performance.now();
    if (this.playing && now - this.lastPresented > 2000 / this.fps + 100) {
      this.playing = false;
      if (!this.done) this.measure.stalled(true, now);
      this.hooks.onPlaying(false);
    }
    const inbound = await this.inbound();
    if (!inbound) return;
    this.received = inbound.framesReceived || 0;
    this.decoded = inbound.framesDecoded || 0;
    this.measure.held(this.held);
    const bytes = inbound.bytesReceived || 0;
    if (bytes > this.bytes) this.measure.received(bytes - this.bytes, now);
    this.bytes = bytes;
  }

  async inbound() {
    if (!this.pc) return null;
    const stats = await this.pc.getStats();
    let found = null;
    stats.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "video") found = s; });
    return found;
  }

  // frames decoded once the server says done (the last ones may still be on their way): the delivery ack's count
  async receivedFrames(published) {
    const deadline = performance.now() + 3000;
    for (;;) {
      const inbound = await this.inbound();
      const decoded = inbound ? inbound.framesDecoded || 0 : 0;
      if (decoded >= published || performance.now() > deadline) return decoded;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
};

function gatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); } };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, timeoutMs); // host candidates come at once; a slow STUN server must not hold the session
  });
}
