// TeleFuser stream client: create a session, receive chunks over a WebSocket, play them on a canvas at the
// session's FPS from a local buffer, send held keys as controls, and acknowledge delivery at the end.
//
// Binary messages are chunk envelopes (telefuser/serving/stream/envelope.py):
//   "TFCH" | uint32 BE header length | JSON header {chunk, first_frame, frames, width, height, fps, codec, sizes, crc32}
//   | frame 0 bytes | frame 1 bytes | ...      (jpeg/png: image files; raw: RGB24)
// Text messages are status events {"type":"status","stage":...}.
//
// API key: when the server requires one, HTTP calls send "Authorization: Bearer <key>" (the key comes from the
// API key field or the page's #api_key=... fragment, which never reaches the server, and stays in sessionStorage);
// the WebSocket opens with the session's stream token that the create reply puts in ws_path.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_BY_CODE = {
    KeyW: "W", KeyS: "S", KeyA: "A", KeyD: "D", KeyJ: "J", KeyL: "L", KeyI: "I", KeyK: "K",
    ArrowUp: "ArrowUp", ArrowDown: "ArrowDown", ArrowLeft: "ArrowLeft", ArrowRight: "ArrowRight",
  };
  const PREBUFFER_CHUNKS = 2;
  const canvas = $("screen");
  const ctx = canvas.getContext("2d");

  const st = {
    ws: null, sessionId: null, fps: 16, totalChunks: null, keyOrder: Object.values(KEY_BY_CODE),
    queue: [], decodeChain: Promise.resolve(), received: 0, drawn: 0, chunks: 0, framesPerChunk: 16,
    playing: false, clock: 0, sinceClock: 0, done: false, published: null, held: new Set(),
    drawTimes: [], lastCompute: null, serverQueue: 0, state: "idle", ack: null,
  };
  window.tfStream = st; // inspection hook (tests, devtools)

  function log(text, cls) {
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
    if (cls) li.className = cls;
    $("log").prepend(li);
    while ($("log").children.length > 200) $("log").lastChild.remove();
  }

  function setState(s) { st.state = s; $("stat-state").textContent = s; }

  // ---- API key -----------------------------------------------------------------------------------------------
  const fromFragment = new URLSearchParams(location.hash.slice(1)).get("api_key");
  if (fromFragment) {
    sessionStorage.setItem("tfApiKey", fromFragment);
    history.replaceState(null, "", location.pathname + location.search); // out of the address bar
  }
  $("api-key").value = sessionStorage.getItem("tfApiKey") || "";

  function authFetch(url, options = {}) {
    const key = $("api-key").value.trim();
    const headers = { ...(options.headers || {}) };
    if (key) headers.Authorization = `Bearer ${key}`;
    return fetch(url, { ...options, headers });
  }

  // ---- metadata ----------------------------------------------------------------------------------------------
  async function loadMetadata() {
    try {
      const response = await authFetch("/v1/service/metadata");
      if (response.status === 401) {
        $("model-info").textContent = "this server requires an API key: enter it below";
        $("model-info").dataset.auth = "required";
        $("api-key").focus();
        return;
      }
      const meta = await response.json();
      $("model-info").dataset.auth = meta.auth && meta.auth.api_key_required ? "accepted" : "none";
      const model = meta.model || {};
      const defaults = model.defaults || {};
      $("model-info").textContent = `${model.model || "model"} · weights: ${model.weights || "?"} · ` +
        `max sessions ${meta.limits.max_sessions} · ${meta.limits.delivery_mode}`;
      const resolutions = [...new Set([defaults.resolution, ...(model.resolutions || [])].filter(Boolean))];
      $("resolution").replaceChildren(...resolutions.map((r) => Object.assign(document.createElement("option"), { textContent: r })));
      if (defaults.num_frames) $("num-frames").value = defaults.num_frames;
      $("fps").value = defaults.fps || model.fps || 16;
      $("seed").value = defaults.seed ?? 42;
      $("codec").value = meta.default_codec === "png" ? "png" : "jpeg";
      if (meta.keys && meta.keys.allowed) st.keyOrder = meta.keys.allowed;
    } catch (err) {
      $("model-info").textContent = `metadata unavailable: ${err}`;
    }
  }

  // ---- session -----------------------------------------------------------------------------------------------
  function readAsBase64(blob) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).split(",", 2)[1]);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(blob);
    });
  }

  async function imageBase64() {
    const file = $("image").files[0];
    return readAsBase64(file || (await (await fetch("/static/default.jpg")).blob()));
  }

  function resetPlayback() {
    for (const bmp of st.queue) bmp.close();
    Object.assign(st, {
      queue: [], decodeChain: Promise.resolve(), received: 0, drawn: 0, chunks: 0, playing: false, sinceClock: 0,
      done: false, published: null, drawTimes: [], lastCompute: null, serverQueue: 0, ack: null,
    });
    $("control-ack").textContent = "none";
    $("control-ack").dataset.keys = "";
    $("control-ack").dataset.appliesFrom = "";
    $("delivery").textContent = "–";
  }

  async function start(ev) {
    ev.preventDefault();
    if (st.ws) st.ws.close();
    resetPlayback();
    setState("creating");
    const numFrames = $("num-frames").value.trim();
    const body = {
      prompt: $("prompt").value,
      image: await imageBase64(),
      codec: $("codec").value,
      config: {
        resolution: $("resolution").value,
        fps: Number($("fps").value),
        seed: Number($("seed").value),
        num_frames: numFrames === "" ? null : Number(numFrames),
      },
    };
    let reply;
    try {
      const r = await authFetch("/v1/stream/sessions", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      reply = await r.json();
      if (!r.ok) throw new Error(`${r.status}: ${reply.detail}`);
    } catch (err) {
      log(`create failed: ${err.message}`, "error");
      setState("error");
      return;
    }
    st.sessionId = reply.session_id;
    // behind the replicas' proxy the session's routes live under its replica's prefix (/r/<replica>), as ws_path says
    st.sessionPath = reply.ws_path.split("?")[0].replace(/\/ws$/, "");
    st.fps = reply.fps || 16;
    st.totalChunks = reply.total_chunks;
    const [w, h] = String(reply.resolution || "832x480").split("x").map(Number);
    canvas.width = w;
    canvas.height = h;
    $("stat-target-fps").textContent = st.fps;
    $("stat-total-chunks").textContent = st.totalChunks ?? "∞";
    log(`session ${st.sessionId}: ${reply.total_chunks ?? "open-ended"} chunks at ${st.fps} FPS`);
    connect(reply.ws_path);
  }

  function connect(path) {
    const url = new URL(path, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    st.ws = ws;
    setState("connecting");
    ws.onopen = () => { $("stop").disabled = false; $("end").disabled = false; canvas.focus(); sendKeys(); };
    ws.onmessage = (msg) => (typeof msg.data === "string" ? onEvent(JSON.parse(msg.data)) : onChunk(msg.data));
    ws.onclose = (e) => {
      log(`websocket closed (${e.code}${e.reason ? " " + e.reason : ""})`);
      if (st.ws === ws) { st.ws = null; $("stop").disabled = true; $("end").disabled = true; }
      if (!st.done) setState("disconnected");
    };
  }

  function send(obj) {
    if (st.ws && st.ws.readyState === WebSocket.OPEN) st.ws.send(JSON.stringify(obj));
  }

  // ---- incoming ----------------------------------------------------------------------------------------------
  function onEvent(ev) {
    switch (ev.stage) {
      case "runtime_ready":
        setState("buffering");
        log(`runtime ready: ${ev.resolution} · ${ev.delivery_mode} · buffer ${ev.buffer_chunks} chunks · ${ev.codec}`);
        break;
      case "chunk_sent":
        st.lastCompute = ev.measurement && ev.measurement.compute_seconds;
        st.serverQueue = ev.queue_depth;
        break;
      case "control_state": {
        const el = $("control-ack");
        el.textContent = `${ev.keys.length ? ev.keys.join("+") : "none"} from chunk ${ev.applies_from_chunk}`;
        el.dataset.keys = ev.keys.join(",");
        el.dataset.appliesFrom = ev.applies_from_chunk;
        el.classList.add("fresh");
        setTimeout(() => el.classList.remove("fresh"), 600);
        break;
      }
      case "done":
        st.done = true;
        st.published = ev.published_frames;
        // Lossless check: the server declares what it sent, we answer with what we got.
        send({ type: "delivery_ack", published_frames: st.received });
        $("delivery").textContent = `server sent ${ev.published_frames}, received ${st.received}`;
        log(`done: ${ev.chunks} chunks, ${ev.published_frames} frames (${ev.reason})`);
        break;
      case "delivery_ack":
        st.ack = ev;
        $("delivery").textContent = `${ev.acked_frames}/${ev.published_frames} frames ${ev.match ? "✓ lossless" : "✗ mismatch"}`;
        $("delivery").dataset.match = String(ev.match);
        break;
      case "error":
        log(`error: ${ev.message}`, "error");
        if (ev.fatal) setState("error");
        break;
      case "closed":
        log(`session closed: ${ev.reason}`);
        break;
      default:
        log(`event ${ev.stage}`);
    }
  }

  function rawToBitmap(bytes, w, h) {
    const rgba = new Uint8ClampedArray(w * h * 4);
    for (let i = 0, j = 0; i < bytes.length; i += 3, j += 4) {
      rgba[j] = bytes[i]; rgba[j + 1] = bytes[i + 1]; rgba[j + 2] = bytes[i + 2]; rgba[j + 3] = 255;
    }
    return createImageBitmap(new ImageData(rgba, w, h));
  }

  function onChunk(buf) {
    const view = new DataView(buf);
    if (buf.byteLength < 8 || String.fromCharCode(...new Uint8Array(buf, 0, 4)) !== "TFCH") {
      log("ignored a binary message that is not a TFCH envelope", "error");
      return;
    }
    const headerLength = view.getUint32(4);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, headerLength)));
    let offset = 8 + headerLength;
    const parts = header.sizes.map((size) => { const part = new Uint8Array(buf, offset, size); offset += size; return part; });
    st.received += header.frames;
    st.chunks = header.chunk + 1;
    if (header.chunk > 0) st.framesPerChunk = header.frames;
    const mime = header.codec === "png" ? "image/png" : "image/jpeg";
    // Frames decode in parallel; the chain keeps chunks in order in the play queue.
    const decoded = Promise.all(parts.map((p) =>
      header.codec === "raw" ? rawToBitmap(p, header.width, header.height) : createImageBitmap(new Blob([p], { type: mime }))));
    st.decodeChain = st.decodeChain
      .then(() => decoded)
      .then((bitmaps) => { st.queue.push(...bitmaps); })
      .catch((err) => log(`chunk ${header.chunk}: decode failed: ${err}`, "error"));
  }

  // ---- playback ----------------------------------------------------------------------------------------------
  function draw(bitmap, now) {
    ctx.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    bitmap.close();
    st.drawn += 1;
    st.drawTimes.push(now);
  }

  function tick() {
    const now = performance.now();
    if (!st.playing) {
      const ready = st.queue.length >= PREBUFFER_CHUNKS * st.framesPerChunk || (st.done && st.queue.length > 0);
      if (ready) {
        st.playing = true;
        st.clock = now;
        st.sinceClock = 0;
        setState("playing");
      }
    }
    if (st.playing) {
      const due = Math.floor(((now - st.clock) * st.fps) / 1000);
      while (st.sinceClock <= due && st.queue.length) {
        draw(st.queue.shift(), now);
        st.sinceClock += 1;
      }
      if (st.sinceClock <= due && !st.queue.length) { // buffer ran dry
        st.playing = false;
        setState(st.done ? "finished" : "buffering");
      }
    }
    while (st.drawTimes.length && now - st.drawTimes[0] > 1000) st.drawTimes.shift();
    if (document.hidden) setTimeout(tick, 10); else requestAnimationFrame(tick);
  }

  function updateStats() {
    $("stat-fps").textContent = st.drawTimes.length.toFixed(1);
    $("stat-drawn").textContent = st.drawn;
    $("stat-received").textContent = st.received;
    $("stat-chunks").textContent = st.chunks;
    $("stat-compute").textContent = st.lastCompute == null ? "–" : `${(st.lastCompute * 1000).toFixed(0)} ms`;
    $("stat-buffer").textContent = st.queue.length;
    $("stat-buffer-chunks").textContent = (st.queue.length / st.framesPerChunk).toFixed(1);
    $("stat-queue").textContent = st.serverQueue;
  }

  // ---- keyboard ----------------------------------------------------------------------------------------------
  function sendKeys() {
    const keys = st.keyOrder.filter((k) => st.held.has(k));
    $("keys-held").textContent = keys.length ? keys.join("+") : "none";
    send({ type: "control", keys });
  }

  function typing(target) { return target && ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName); }

  document.addEventListener("keydown", (e) => {
    const key = KEY_BY_CODE[e.code];
    if (!key || typing(e.target) || e.ctrlKey || e.metaKey || e.altKey) return;
    e.preventDefault();
    if (!st.held.has(key)) { st.held.add(key); sendKeys(); }
  });
  document.addEventListener("keyup", (e) => {
    const key = KEY_BY_CODE[e.code];
    if (key && st.held.delete(key)) sendKeys();
  });
  window.addEventListener("blur", () => { if (st.held.size) { st.held.clear(); sendKeys(); } });

  // ---- buttons -----------------------------------------------------------------------------------------------
  $("session-form").addEventListener("submit", start);
  $("stop").addEventListener("click", () => { send({ type: "stop" }); log("stop requested"); });
  $("end").addEventListener("click", async () => {
    if (st.sessionId) await authFetch(st.sessionPath, { method: "DELETE" });
    if (st.ws) st.ws.close();
    log("session ended");
  });
  $("image").addEventListener("change", () => {
    const file = $("image").files[0];
    if (file) $("image-preview").src = URL.createObjectURL(file);
  });
  canvas.addEventListener("click", () => canvas.focus());
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("tfApiKey", $("api-key").value.trim());
    loadMetadata();
  });

  loadMetadata();
  setInterval(updateStats, 250);
  tick();
})();
