// The WebSocket transport: chunk envelopes in, decoded into a frame queue and drawn on the canvas at the session's
// FPS; status events and client messages as JSON text. The page reports what it has drawn (`playout`), which is
// what bounds the server's lead (PROTOCOL.md, "Bounded playout").
//
// Binary messages are chunk envelopes (telefuser/serving/stream/envelope.py):
//   "TFCH" | uint32 BE header length | JSON header {chunk, first_frame, frames, width, height, fps, codec, sizes, crc32,
//   control_generation, control_seq, computed_at} | frame 0 bytes | frame 1 bytes | ...  (jpeg/png: image files;
//   raw: RGB24). Frames join the play queue in order as they are decoded; the next tick (animation frame) after a
//   chunk's first frame is queued is when the page could first draw it: the end of its transport overhead (measure.js).
"use strict";
window.TF = window.TF || {};

TF.WsPlayer = class {
  // hooks: {onEvent(ev), onClosed(code, reason), onPlaying(bool), log(text, cls)}
  constructor(canvas, measure, hooks) {
    Object.assign(this, { canvas, ctx: canvas.getContext("2d"), measure, hooks });
    this.kind = "websocket";
    this.queue = []; // {bitmap, seq, chunk}
    this.readyChunks = []; // {chunk, computedAt}: first frame decoded and queued since the last tick
    this.decodeChain = Promise.resolve();
    this.received = 0; // frames whose envelope arrived
    this.drawn = 0;
    this.chunks = 0;
    this.playing = false;
    this.done = false;
    this.decodedChunks = 0;
    this.startedChunks = 0; // chunks whose first frame was drawn
    this.lastReport = 0;
    this.fps = 16;
    this.prebufferChunks = 1;
    this.running = true;
  }

  get held() { return this.received - this.drawn; }

  // path: the create reply's ws_path; the runtime_ready event's fields arrive later (configure)
  connect(path, fps) {
    this.fps = fps;
    const url = new URL(path, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => this.report(true); // says this page reports playout, before the first chunk
    ws.onmessage = (msg) => (typeof msg.data === "string" ? this.hooks.onEvent(JSON.parse(msg.data)) : this.onChunk(msg.data));
    ws.onclose = (e) => this.hooks.onClosed(e.code, e.reason);
    this.tick();
  }

  // runtime_ready: realtime mode plays as soon as a frame is decoded; lossless waits for two chunks (or the buffer)
  configure(ready) {
    this.prebufferChunks = ready.delivery_mode === "realtime" ? 0 : Math.min(2, ready.buffer_chunks || 2);
  }

  send(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) { this.ws.send(JSON.stringify(obj)); return true; }
    return false;
  }

  close() { this.running = false; if (this.ws) this.ws.close(); for (const f of this.queue) f.bitmap.close(); this.queue = []; }

  report(force) {
    const now = performance.now();
    if (!force && now - this.lastReport < 100) return;
    this.lastReport = now;
    this.send({ type: "playout", frames_played: this.drawn, frames_buffered: this.held });
  }

  onChunk(buf) {
    const now = performance.now();
    const view = new DataView(buf);
    if (buf.byteLength < 8 || String.fromCharCode(...new Uint8Array(buf, 0, 4)) !== "TFCH") {
      this.hooks.log("ignored a binary message that is not a TFCH envelope", "error");
      return;
    }
    const headerLength = view.getUint32(4);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, headerLength)));
    let offset = 8 + headerLength;
    const parts = header.sizes.map((size) => { const part = new Uint8Array(buf, offset, size); offset += size; return part; });
    this.received += header.frames;
    this.chunks = header.chunk + 1;
    this.measure.chunkArrived(now, buf.byteLength);
    this.measure.held(this.held);
    const mime = header.codec === "png" ? "image/png" : "image/jpeg";
    // Frames decode in parallel; the chain queues each one, in order, as soon as it and those before it are decoded,
    // so a chunk's first frame can be drawn before its last one is decoded.
    const decodes = parts.map((p) =>
      header.codec === "raw" ? rawToBitmap(p, header.width, header.height) : createImageBitmap(new Blob([p], { type: mime })));
    const ready = { chunk: header.chunk, computedAt: header.computed_at };
    if (!decodes.length) { this.decodedChunks += 1; this.readyChunks.push(ready); return; }
    decodes.forEach((decoding, i) => {
      this.decodeChain = this.decodeChain.then(() => decoding).then((bitmap) => {
        this.queue.push({ bitmap, seq: header.control_seq, chunk: header.chunk });
        if (i === 0) this.readyChunks.push(ready); // its first frame is drawable from the next tick
        if (i === decodes.length - 1) this.decodedChunks += 1;
      });
    });
    this.decodeChain = this.decodeChain.catch((err) => this.hooks.log(`chunk ${header.chunk}: decode failed: ${err}`, "error"));
  }

  ready() {
    if (this.done) return this.queue.length > 0;
    if (this.prebufferChunks === 0) return this.queue.length > 0;
    return this.decodedChunks - this.startedChunks >= this.prebufferChunks;
  }

  draw(frame, now) {
    this.ctx.drawImage(frame.bitmap, 0, 0, this.canvas.width, this.canvas.height);
    frame.bitmap.close();
    this.drawn += 1;
    this.startedChunks = Math.max(this.startedChunks, frame.chunk + 1);
    this.measure.drawn(frame.seq, frame.chunk, now);
  }

  tick() {
    if (!this.running) return;
    const now = performance.now();
    for (const r of this.readyChunks) this.measure.transported(r.chunk, r.computedAt, now, 0); // drawable from now
    this.readyChunks = [];
    if (!this.playing && this.ready()) {
      this.playing = true;
      this.measure.stalled(false, now);
      this.clock = now;
      this.sinceClock = 0;
      this.hooks.onPlaying(true);
      this.report(true);
    }
    if (this.playing) {
      const due = Math.floor(((now - this.clock) * this.fps) / 1000);
      let drew = false;
      while (this.sinceClock <= due && this.queue.length) {
        this.draw(this.queue.shift(), now);
        this.sinceClock += 1;
        drew = true;
      }
      if (this.sinceClock <= due && !this.queue.length) { // the buffer ran dry
        this.playing = false;
        if (!this.done) this.measure.stalled(true, now);
        this.hooks.onPlaying(false);
        this.report(true);
      } else if (drew) {
        this.report(false);
      }
    }
    if (document.hidden) setTimeout(() => this.tick(), 10); else requestAnimationFrame(() => this.tick());
  }

  // frames received when the server says done: what the delivery ack declares
  async receivedFrames() { return this.received; }
};

function rawToBitmap(bytes, w, h) {
  const rgba = new Uint8ClampedArray(w * h * 4);
  for (let i = 0, j = 0; i < bytes.length; i += 3, j += 4) {
    rgba[j] = bytes[i]; rgba[j + 1] = bytes[i + 1]; rgba[j + 2] = bytes[i + 2]; rgba[j + 3] = 255;
  }
  return createImageBitmap(new ImageData(rgba, w, h));
}
