#!/usr/bin/env node
// A STAND-IN for GitLab's duo CLI (@gitlab/duo-cli), which cannot be installed here. It does
// what `duo run --existing-session-id ID --connection-type websocket` does as far as the job
// pod's network and files can tell: it opens a WebSocket session with the Duo Workflow
// Service through the GitLab instance (through HTTPS_PROXY/HTTP_PROXY with a CONNECT tunnel
// when set), then carries out the actions the service sends (run a command, edit a file, open
// a merge request through the instance's API) and answers each with its result.
//
// Protocol (JSON text frames): the service sends {"id", "action", ...}; the CLI answers
// {"id", "ok", "output"}. Actions: run_command {command}, edit_file {path, old, new},
// create_merge_request {source_branch, target_branch, title}, finish {}. Node.js 18 or later,
// standard library only.
//
// Like duo CLI 9.29.0, `duo run` writes into $HOME before anything else: its ripgrep
// (writeRipgrepIntoHome). GitLab's image v0.0.22 shipped that CLI and was reverted because
// GitLab's own sandbox mounted $HOME read-only, so a job pod whose $HOME its user cannot write
// fails every flow; the stand-in fails the same way, in one line that says why.
'use strict'

const crypto = require('crypto')
const fs = require('fs')
const http = require('http')
const net = require('net')
const os = require('os')
const path = require('path')
const { execSync } = require('child_process')

const VERSION = '0.0.0-standin'

function fail(msg) {
  process.stderr.write('duo: ' + msg + '\n')
  process.exit(1)
}

function proxyFor(url) {
  const env = process.env
  const p = url.protocol === 'https:' || url.protocol === 'wss:'
    ? env.HTTPS_PROXY || env.https_proxy
    : env.HTTP_PROXY || env.http_proxy
  return p ? new URL(p) : null
}

function hostPort(url) {
  const port = url.port || (url.protocol === 'https:' || url.protocol === 'wss:' ? 443 : 80)
  return { host: url.hostname, port: Number(port) }
}

// connectTCP opens a TCP connection to url's host, through the proxy's CONNECT when one is set.
function connectTCP(url) {
  const dest = hostPort(url)
  const proxy = proxyFor(url)
  return new Promise((resolve, reject) => {
    if (!proxy) {
      const s = net.connect(dest.port, dest.host, () => resolve(s))
      s.once('error', reject)
      return
    }
    const req = http.request({
      host: proxy.hostname, port: Number(proxy.port || 80), method: 'CONNECT',
      path: dest.host + ':' + dest.port,
    })
    req.once('connect', (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy()
        reject(new Error('proxy refused CONNECT ' + dest.host + ':' + dest.port + ': ' + res.statusCode + ' ' + res.statusMessage))
        return
      }
      resolve(socket)
    })
    req.once('error', reject)
    req.end()
  })
}

// A minimal RFC 6455 client: text frames, masked, no extensions.
class WebSocket {
  constructor(socket) {
    this.socket = socket
    this.buf = Buffer.alloc(0)
    this.waiters = []
    this.messages = []
    this.closed = false
    socket.on('data', d => { this.buf = Buffer.concat([this.buf, d]); this.parse() })
    socket.on('close', () => { this.closed = true; this.flush() })
    socket.on('error', () => { this.closed = true; this.flush() })
  }

  static async open(url, headers) {
    const socket = await connectTCP(url)
    const key = crypto.randomBytes(16).toString('base64')
    const lines = [
      'GET ' + url.pathname + url.search + ' HTTP/1.1', 'Host: ' + url.host, 'Upgrade: websocket',
      'Connection: Upgrade', 'Sec-WebSocket-Key: ' + key, 'Sec-WebSocket-Version: 13',
    ]
    for (const [k, v] of Object.entries(headers)) lines.push(k + ': ' + v)
    socket.write(lines.join('\r\n') + '\r\n\r\n')
    const head = await new Promise((resolve, reject) => {
      let acc = Buffer.alloc(0)
      const onData = d => {
        acc = Buffer.concat([acc, d])
        const end = acc.indexOf('\r\n\r\n')
        if (end < 0) return
        socket.removeListener('data', onData)
        socket.pause()
        resolve({ text: acc.subarray(0, end).toString(), rest: acc.subarray(end + 4) })
      }
      socket.on('data', onData)
      socket.once('error', reject)
      socket.once('close', () => reject(new Error('connection closed during the WebSocket handshake')))
    })
    const status = head.text.split('\r\n')[0]
    if (!/^HTTP\/1\.1 101/.test(status)) throw new Error('WebSocket handshake refused: ' + status)
    const accept = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
    if (!head.text.toLowerCase().includes('sec-websocket-accept: ' + accept.toLowerCase())) throw new Error('bad Sec-WebSocket-Accept')
    socket.removeAllListeners('close')
    socket.removeAllListeners('error')
    const ws = new WebSocket(socket)
    ws.buf = head.rest
    socket.resume()
    ws.parse()
    return ws
  }

  parse() {
    for (;;) {
      if (this.buf.length < 2) break
      const op = this.buf[0] & 0x0f
      let len = this.buf[1] & 0x7f
      let off = 2
      if (len === 126) { if (this.buf.length < 4) break; len = this.buf.readUInt16BE(2); off = 4 }
      if (len === 127) { if (this.buf.length < 10) break; len = Number(this.buf.readBigUInt64BE(2)); off = 10 }
      if (this.buf.length < off + len) break
      const payload = this.buf.subarray(off, off + len)
      this.buf = this.buf.subarray(off + len)
      if (op === 1) this.messages.push(payload.toString())
      if (op === 8) this.closed = true
      if (op === 9) this.frame(10, payload)
    }
    this.flush()
  }

  flush() {
    while (this.waiters.length && (this.messages.length || this.closed)) {
      this.waiters.shift()(this.messages.length ? this.messages.shift() : null)
    }
  }

  receive() { return new Promise(resolve => { this.waiters.push(resolve); this.flush() }) }

  frame(op, payload) {
    const mask = crypto.randomBytes(4)
    const n = payload.length
    const head = n < 126 ? Buffer.from([0x80 | op, 0x80 | n])
      : n < 65536 ? Buffer.from([0x80 | op, 0x80 | 126, n >> 8, n & 0xff])
        : Buffer.concat([Buffer.from([0x80 | op, 0x80 | 127]), (() => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(n)); return b })()])
    const body = Buffer.from(payload)
    for (let i = 0; i < body.length; i++) body[i] ^= mask[i % 4]
    this.socket.write(Buffer.concat([head, mask, body]))
  }

  send(obj) { this.frame(1, Buffer.from(JSON.stringify(obj))) }

  close() { this.frame(8, Buffer.alloc(0)); this.socket.end() }
}

// request sends an HTTP request, through HTTP_PROXY (absolute-form) for http:// URLs.
function request(method, url, headers, body) {
  const proxy = proxyFor(url)
  const opts = proxy
    ? { host: proxy.hostname, port: Number(proxy.port || 80), path: url.href }
    : { host: url.hostname, port: hostPort(url).port, path: url.pathname + url.search }
  return new Promise((resolve, reject) => {
    const req = http.request({ ...opts, method, headers: { ...headers, Host: url.host } }, res => {
      let data = ''
      res.on('data', d => { data += d })
      res.on('end', () => resolve({ status: res.statusCode, body: data }))
    })
    req.once('error', reject)
    if (body) req.write(body)
    req.end()
  })
}

async function perform(msg) {
  switch (msg.action) {
    case 'run_command':
      try {
        return { ok: true, output: execSync(msg.command, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }) }
      } catch (e) {
        return { ok: false, output: String(e.stdout || '') + String(e.stderr || '') }
      }
    case 'edit_file': {
      const text = fs.readFileSync(msg.path, 'utf8')
      if (!text.includes(msg.old)) return { ok: false, output: msg.path + ': text to replace not found' }
      fs.writeFileSync(msg.path, text.replace(msg.old, msg.new))
      return { ok: true, output: 'edited ' + msg.path }
    }
    case 'create_merge_request': {
      const env = process.env
      const url = new URL(env.CI_API_V4_URL + '/projects/' + env.CI_PROJECT_ID + '/merge_requests')
      const body = JSON.stringify({ source_branch: msg.source_branch, target_branch: msg.target_branch, title: msg.title })
      const res = await request('POST', url, { 'JOB-TOKEN': env.CI_JOB_TOKEN || '', 'Content-Type': 'application/json' }, body)
      if (res.status !== 201) return { ok: false, output: 'merge request: HTTP ' + res.status + ' ' + res.body.slice(0, 200) }
      const mr = JSON.parse(res.body)
      return { ok: true, output: 'merge request !' + mr.iid + ' ' + mr.web_url }
    }
    default:
      return { ok: false, output: 'unknown action ' + msg.action }
  }
}

// RIPGREP_IN_HOME is where the stand-in writes its ripgrep, under $HOME. 9.29.0 writes its own
// rg into $HOME; its exact path is not public here, so this one is the stand-in's choice.
const RIPGREP_IN_HOME = path.join('.duo', 'bin', 'rg')

// writeRipgrepIntoHome does what duo CLI 9.29.0 does at start: it puts an rg into $HOME (the
// image's ripgrep when it has one on PATH, else a placeholder that says so), or ends the CLI
// with one line naming $HOME, the error and why it must be writable.
function writeRipgrepIntoHome() {
  const home = process.env.HOME || os.homedir()
  const dest = path.join(home, RIPGREP_IN_HOME)
  let source = ''
  for (const dir of (process.env.PATH || '').split(':')) {
    const candidate = dir && path.join(dir, 'rg')
    if (candidate && candidate !== dest && fs.existsSync(candidate)) { source = candidate; break }
  }
  try {
    // One level at a time: Node's recursive mkdir never returns where mkdir fails with ENOENT
    // under an existing directory (/proc, say).
    for (const dir of [path.join(home, '.duo'), path.dirname(dest)]) {
      try { fs.mkdirSync(dir) } catch (e) { if (e.code !== 'EEXIST') throw e }
    }
    if (source) {
      fs.copyFileSync(source, dest)
    } else {
      fs.writeFileSync(dest, '#!/bin/sh\necho "rg: no ripgrep in this image (duo CLI stand-in placeholder)" >&2\nexit 127\n')
    }
    fs.chmodSync(dest, 0o755)
  } catch (e) {
    fail('$HOME (' + home + ') is not writable: ' + e.message + ': the duo CLI writes its ripgrep into $HOME at start ' +
      '(as 9.29.0 does), so the job\'s user must be able to write to $HOME')
  }
  console.log('duo: $HOME is writable: wrote ' + dest + ' (' + (source ? 'ripgrep from ' + source : 'a placeholder: no rg on PATH') + ')')
}

async function run(args) {
  writeRipgrepIntoHome()
  const sessionIdx = args.indexOf('--existing-session-id')
  const session = sessionIdx >= 0 ? args[sessionIdx + 1] : ''
  if (!session) fail('run: --existing-session-id is required')
  const base = process.env.GITLAB_BASE_URL
  if (!base) fail('run: GITLAB_BASE_URL is not set')
  const url = new URL(base.replace(/^http/, 'ws').replace(/\/$/, '') + '/api/v4/ai/duo_workflows/ws?workflow_id=' + encodeURIComponent(session))
  console.log('duo: session ' + session + ': connecting to the workflow service through ' + url.host)
  const ws = await WebSocket.open(url, { Authorization: 'Bearer ' + (process.env.GITLAB_OAUTH_TOKEN || '') })
  console.log('duo: session ' + session + ': connected (websocket)')
  for (;;) {
    const text = await ws.receive()
    if (text === null) fail('the workflow service closed the session before it finished')
    const msg = JSON.parse(text)
    if (msg.action === 'finish') {
      console.log('duo: session ' + session + ': finished: ' + (msg.summary || ''))
      ws.close()
      return
    }
    console.log('duo: ' + msg.action + (msg.command ? ': ' + msg.command : msg.path ? ': ' + msg.path : ''))
    const res = await perform(msg)
    process.stdout.write(res.output.endsWith('\n') || !res.output ? res.output : res.output + '\n')
    ws.send({ id: msg.id, ok: res.ok, output: res.output })
  }
}

async function main() {
  const args = process.argv.slice(2)
  if (args[0] === '--version') { console.log(VERSION); return }
  if (args[0] === 'run') { await run(args.slice(1)); return }
  fail('usage: duo --version | duo run --existing-session-id ID --connection-type websocket')
}

main().catch(e => fail(e.message))
