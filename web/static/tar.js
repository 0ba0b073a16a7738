// Reads a file out of a .tar.gz in the browser (DecompressionStream + the ustar/pax header format), so the job
// page can show the artifact's schedule.py (the TVMScript of the best schedule) from the public download.

const decoder = new TextDecoder();

function cstring(bytes, start, length) {
  const field = bytes.subarray(start, start + length);
  const end = field.indexOf(0);
  return decoder.decode(end === -1 ? field : field.subarray(0, end));
}

function paxPath(bytes) {
  // records "LEN key=value\n"
  for (const line of decoder.decode(bytes).split('\n')) {
    const m = /^\d+ path=(.*)$/.exec(line);
    if (m) return m[1];
  }
  return null;
}

/** The members of a gzipped tar as a Map of name -> Uint8Array (regular files only). */
export async function readTarGz(blob) {
  const stream = blob.stream().pipeThrough(new DecompressionStream('gzip'));
  const bytes = new Uint8Array(await new Response(stream).arrayBuffer());
  const files = new Map();
  let offset = 0;
  let longName = null;
  while (offset + 512 <= bytes.length) {
    const header = bytes.subarray(offset, offset + 512);
    if (header.every((b) => b === 0)) break;
    const size = parseInt(cstring(header, 124, 12).trim() || '0', 8);
    const type = String.fromCharCode(header[156] || 48);
    const prefix = cstring(header, 345, 155);
    let name = cstring(header, 0, 100);
    if (prefix) name = `${prefix}/${name}`;
    const body = bytes.subarray(offset + 512, offset + 512 + size);
    offset += 512 + Math.ceil(size / 512) * 512;
    if (type === 'x') {
      longName = paxPath(body);
    } else if (type === 'L') {
      longName = cstring(body, 0, body.length);
    } else {
      if (type === '0' || type === '\0') files.set((longName || name).replace(/^\.\//, ''), body);
      longName = null;
    }
  }
  return files;
}
