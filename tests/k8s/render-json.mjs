// Prints the objects a kustomization renders to (render.mjs) as one JSON
// array, for tests written in other languages (multihost_test runs the
// cpu-smoke pods from it).
//   node tests/k8s/render-json.mjs deploy/k8s/overlays/cpu-smoke
import { render } from "./render.mjs";

if (process.argv.length !== 3) {
  console.error("usage: render-json.mjs KUSTOMIZATION_DIR");
  process.exit(2);
}
process.stdout.write(JSON.stringify(render(process.argv[2])) + "\n");
