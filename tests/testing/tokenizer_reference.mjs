// Writes reference encodings for the tokenizer parity test.
//
//   node tests/testing/tokenizer_reference.mjs DEST CORPUS [NAME...]
//
// DEST is the fixtures directory prepared by fetch_fixtures.sh: it holds
// DEST/npm (an npm prefix with @lenml/tokenizers installed) and
// DEST/tokenizers/<name>/tokenizer.json (+ tokenizer_config.json). For each
// name (default: qwen3 llama3) this writes DEST/tokenizers/<name>/reference.jsonl
// with one {"text": ..., "ids": [...]} line per corpus line, encoded with
// add_special_tokens=false. Exits non-zero on any failure; writes each output
// through a temporary file so a failed run leaves no partial reference.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

function fail(message) {
  console.error(`tokenizer_reference: ${message}`);
  process.exit(1);
}

const [dest, corpusPath, ...names] = process.argv.slice(2);
if (!dest || !corpusPath) fail("usage: tokenizer_reference.mjs DEST CORPUS [NAME...]");
const tokenizerNames = names.length > 0 ? names : ["qwen3", "llama3"];

// Resolve the library from DEST/npm, not from this script's directory.
const require = createRequire(path.join(path.resolve(dest), "npm", "package.json"));
let TokenizerLoader;
try {
  ({ TokenizerLoader } = require("@lenml/tokenizers"));
} catch (error) {
  fail(`cannot load @lenml/tokenizers from ${dest}/npm: ${error.message}`);
}

const texts = [];
const corpusLines = fs.readFileSync(corpusPath, "utf8").split("\n");
corpusLines.forEach((line, index) => {
  if (line.trim() === "") return;
  let record;
  try {
    record = JSON.parse(line);
  } catch (error) {
    fail(`${corpusPath}:${index + 1}: not valid JSON: ${error.message}`);
  }
  if (typeof record.text !== "string") fail(`${corpusPath}:${index + 1}: no "text" string`);
  texts.push(record.text);
});
if (texts.length === 0) fail(`${corpusPath}: no lines`);

for (const name of tokenizerNames) {
  const dir = path.join(dest, "tokenizers", name);
  const jsonPath = path.join(dir, "tokenizer.json");
  const configPath = path.join(dir, "tokenizer_config.json");
  if (!fs.existsSync(jsonPath)) fail(`${jsonPath} is missing`);
  const tokenizerJSON = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  const tokenizerConfig = fs.existsSync(configPath)
    ? JSON.parse(fs.readFileSync(configPath, "utf8"))
    : {};
  const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const out = [];
  for (const text of texts) {
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    if (!Array.isArray(ids) || ids.some((id) => !Number.isInteger(id))) {
      fail(`${name}: encode(${JSON.stringify(text)}) gave ${JSON.stringify(ids)}`);
    }
    out.push(JSON.stringify({ text, ids }));
  }
  const target = path.join(dir, "reference.jsonl");
  const temporary = `${target}.tmp${process.pid}`;
  fs.writeFileSync(temporary, out.join("\n") + "\n");
  fs.renameSync(temporary, target);
  console.log(`tokenizer_reference: ${name}: ${out.length} lines -> ${target}`);
}
