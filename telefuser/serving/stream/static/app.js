// TeleFuser stream client: create a session, receive it over WebRTC when the server offers it (webrtc_player.js) or
// over the WebSocket (ws_player.js), send held keys as controls, show what the stream does (measure.js), and
// acknowledge delivery at the end. Status events are the same JSON on both transports (PROTOCOL.md).
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
  const canvas = $("screen");
  const video = $("video");

  const st = {
    player: null, sessionId: null, sessionPath: null, fps: 16, totalChunks: null, keyOrder: Object.values(KEY_BY_CODE),
    measure: new TF.Measure(), ready: null, done: false, published: null, held: new Set(), seq: 0,
    lastCompute: null, serverQueue: 0, state: "idle", ack: null, webrtcOffered: false, transport: null,
  };
  // inspection hook (tests, benchmarks, devtools)
  window.tfStream = {
    get drawn() { return st.player ? st.player.drawn : 0; },
    get received() { return st.player ? st.player.received : 0; },
    get chunks() { return st.player ? st.player.chunks : 0; },
    get held() { return st.player ? st.player.held : 0; },
    get state() { return st.state; },
    get transport() { return st.transport; },
    get ready() { return st.ready; },
    get ack() { return st.ack; },
    get sessionId() { return st.sessionId; },
    summary: () => ({ ...st.measure.summary(), transport: st.transport, buffer_frames: st.ready && st.ready.buffer_frames }),
    measure: () => st.measure,
    player: () => st.player,
  };

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
      st.webrtcOffered = Boolean(meta.webrtc && meta.webrtc.enabled);
      $("model-info").textContent = `${model.model || "model"} · weights: ${model.weights || "?"} · ` +
        `max sessions ${meta.limits.max_sessions} · ${meta.limits.delivery_mode} · ` +
        `${st.webrtcOffered ? "WebRTC" : "WebSocket"}`;
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

  function reset() {
    if (st.player) st.player.close();
    Object.assign(st, {
      player: null, measure: new TF.Measure(), ready: null, done: false, published: null, lastCompute: null,
      serverQueue: 0, ack: null, transport: null,
    });
    $("control-ack").textContent = "none";
    $("control-ack").dataset.keys = "";
    $("control-ack").dataset.appliesFrom = "";
    $("delivery").textContent = "–";
    $("delivery").dataset.match = "";
  }

  async function start(ev) {
    ev.preventDefault();
    reset();
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
      $("refusal").textContent = err.message;
      setState("refused");
      return;
    }
    $("refusal").textContent = "";
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
    await connect(reply);
  }

  const hooks = {
    onEvent: (ev) => onEvent(ev),
    onClosed: (code, reason) => {
      log(`${st.transport} closed${code ? ` (${code}${reason ? " " + reason : ""})` : ""}`);
      $("stop").disabled = true;
      $("end").disabled = true;
      if (!st.done && st.state !== "error") setState("disconnected");
    },
    onPlaying: (playing) => {
      if (playing) setState("playing");
      else setState(st.done ? "finished" : "buffering");
    },
    onOpen: () => {
      $("stop").disabled = false;
      $("end").disabled = false;
      canvas.focus();
      if (st.held.size) sendKeys(); // keys held before the stream opened; none is the server's start state
    },
    log,
  };

  async function connect(reply) {
    const wantRtc = st.webrtcOffered && reply.webrtc_path && window.RTCPeerConnection && $("transport").value !== "websocket";
    if (wantRtc) {
      const player = new TF.RtcPlayer(video, st.measure, hooks);
      st.player = player;
      st.transport = "webrtc";
      showSurface("webrtc");
      setState("connecting");
      try {
        await player.connect(reply.webrtc_path, authFetch, st.fps, (reply.webrtc && reply.webrtc.ice_servers) || []);
        return;
      } catch (err) {
        log(`WebRTC failed (${err.message}); falling back to the WebSocket`, "error");
        player.close();
        if (!player.fallbackOk) { setState("error"); return; }
      }
    }
    const player = new TF.WsPlayer(canvas, st.measure, hooks);
    st.player = player;
    st.transport = "websocket";
    showSurface("websocket");
    setState("connecting");
    player.connect(reply.ws_path, st.fps);
    player.ws.addEventListener("open", hooks.onOpen);
  }

  function showSurface(kind) {
    canvas.hidden = kind !== "websocket";
    video.hidden = kind !== "webrtc";
    $("stat-transport").textContent = kind;
  }

  function send(obj) { return st.player ? st.player.send(obj) : false; }

  // ---- incoming ----------------------------------------------------------------------------------------------
  async function onEvent(ev) {
    switch (ev.stage) {
      case "runtime_ready":
        st.ready = ev;
        st.player.configure(ev);
        setState("buffering");
        $("stat-buffer-max").textContent = `${ev.buffer_frames} frames (${ev.buffer_chunks} chunks)`;
        log(`runtime ready: ${ev.resolution} · ${ev.delivery_mode} · buffer ${ev.buffer_chunks} chunks · ${st.transport}`);
        break;
      case "chunk_sent":
        st.lastCompute = ev.measurement && ev.measurement.compute_seconds;
        st.serverQueue = ev.queue_depth;
        if (st.lastCompute) st.measure.computed(ev.frames, st.lastCompute);
        if (st.player.chunkSent) st.player.chunkSent(ev);
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
      case "done": {
        st.done = true;
        st.player.done = true;
        st.published = ev.published_frames;
        // Lossless check: the server declares what it sent, we answer with what we got.
        const received = await st.player.receivedFrames(ev.published_frames);
        send({ type: "delivery_ack", published_frames: received });
        $("delivery").textContent = `server sent ${ev.published_frames}, received ${received}`;
        log(`done: ${ev.chunks} chunks, ${ev.published_frames} frames (${ev.reason})`);
        if (!st.player.playing && st.player.held === 0) setState("finished"); // everything was on screen already
        break;
      }
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

  // ---- stats -------------------------------------------------------------------------------------------------
  const fmt = (v, digits = 0, unit = "") => (v === null || v === undefined ? "–" : `${v.toFixed(digits)}${unit}`);

  function updateStats() {
    const p = st.player;
    const m = st.measure;
    const now = performance.now();
    const playback = m.playbackFps(now);
    const generation = m.generationFps();
    const chunkFrames = (st.ready && st.ready.chunk_frames) || 16;
    $("stat-fps").textContent = playback.toFixed(1);
    $("stat-gen-fps").textContent = fmt(generation, 1);
    $("stat-drawn").textContent = p ? p.drawn : 0;
    $("stat-received").textContent = p ? p.received : 0;
    $("stat-chunks").textContent = p ? p.chunks : 0;
    $("stat-compute").textContent = st.lastCompute == null ? "–" : `${(st.lastCompute * 1000).toFixed(0)} ms`;
    $("stat-buffer").textContent = p ? p.held : 0;
    $("stat-buffer-chunks").textContent = ((p ? p.held : 0) / chunkFrames).toFixed(1);
    $("stat-queue").textContent = st.serverQueue;
    const s = m.summary();
    $("stat-latency").textContent = s.controls ? `${fmt(s.latency_p50_ms)} / ${fmt(s.latency_p95_ms)} ms (${s.controls})` : "–";
    $("stat-interval").textContent = fmt(s.chunk_interval_mean_ms, 0, " ms");
    $("stat-overhead").textContent = s.overhead_chunks ? `${fmt(s.overhead_p50_ms)} / ${fmt(s.overhead_p95_ms)} ms (${s.overhead_chunks})` : "–";
    $("stat-rate").textContent = s.bytes_per_s === null ? "–" : `${((s.bytes_per_s * 8) / 1e6).toFixed(2)} Mbit/s`;
    const slow = generation !== null && m.computeFps.length >= 2 && generation < st.fps * 0.97 && !st.done;
    $("slow-warning").hidden = !slow;
    if (slow) {
      $("slow-warning").textContent = `The model generates ${generation.toFixed(1)} FPS, slower than the ` +
        `${st.fps} FPS playback: the picture pauses between chunks, and a key shows after about one chunk's compute ` +
        `(${st.lastCompute ? st.lastCompute.toFixed(1) : "?"} s).`;
    }
  }

  // ---- keyboard ----------------------------------------------------------------------------------------------
  function sendKeys() {
    const keys = st.keyOrder.filter((k) => st.held.has(k));
    $("keys-held").textContent = keys.length ? keys.join("+") : "none";
    st.seq += 1;
    if (send({ type: "control", keys, seq: st.seq })) st.measure.pressed(st.seq, keys, performance.now());
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
    if (st.player) st.player.close();
    log("session ended");
  });
  $("image").addEventListener("change", () => {
    const file = $("image").files[0];
    if (file) $("image-preview").src = URL.createObjectURL(file);
  });
  for (const surface of [canvas, video]) surface.addEventListener("click", () => surface.focus());
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("tfApiKey", $("api-key").value.trim());
    loadMetadata();
  });

  // leaving the page closes the stream at once (a WebRTC peer would otherwise be missed only by ICE consent checks)
  window.addEventListener("pagehide", () => { if (st.player) st.player.close(); });

  loadMetadata();
  setInterval(updateStats, 250);
})();
