// A small kustomize renderer for machines without kubectl: the subset
// deploy/k8s uses, with kustomize's semantics.
//
//   resources:  files (multi-document YAML) and directories holding a
//               kustomization.yaml (rendered first, recursively)
//   patches:    strategic-merge patches from `path` or inline `patch`, aimed
//               by their own apiVersion/kind/metadata.name (or `target`):
//               maps merge, `null` deletes a key, `$patch: delete` deletes
//               the object, lists of containers/env/volumes/... merge by
//               their key (name, mountPath, containerPort), other lists are
//               replaced
//   images:     name -> newName / newTag on containers and initContainers
//
// Anything else in a kustomization.yaml is refused, so a manifest never
// relies on a feature this renderer would silently skip.
//
//   import { render } from "./render.mjs";
//   const objects = render("deploy/k8s/overlays/cpu-smoke");
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

const KNOWN_FIELDS = new Set(["apiVersion", "kind", "resources", "patches", "images"]);

// Strategic-merge keys of the list fields deploy/k8s patches.
const MERGE_KEYS = {
  containers: "name",
  initContainers: "name",
  env: "name",
  volumes: "name",
  volumeMounts: "mountPath",
  ports: "containerPort",
  imagePullSecrets: "name",
};

function readYamlDocuments(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length > 0) throw new Error(`${file}: ${doc.errors[0].message}`);
  }
  return docs.map((d) => d.toJS()).filter((o) => o !== null && o !== undefined);
}

function idOf(object) {
  return `${object.kind}/${object.metadata?.name}`;
}

// As kustomize orders a merged list: the patch's items first (in patch
// order, merged with their base item), then the base items it left alone.
function mergeList(base, patch, key) {
  const out = [];
  const touched = new Set();
  for (const item of patch) {
    if (item === null || typeof item !== "object" || !(key in item)) {
      throw new Error(`list patch item without merge key "${key}": ${JSON.stringify(item)}`);
    }
    touched.add(item[key]);
    if (item.$patch === "delete") continue;
    const original = base.find((b) => b[key] === item[key]);
    out.push(merge(original ?? {}, item));
  }
  for (const item of base) {
    if (!touched.has(item[key])) out.push(structuredClone(item));
  }
  return out;
}

// Strategic merge of `patch` into `base` (both plain objects).
export function merge(base, patch) {
  const out = structuredClone(base);
  for (const [field, value] of Object.entries(patch)) {
    if (field === "$patch") continue;
    if (value === null) {
      delete out[field];
    } else if (Array.isArray(value)) {
      const key = MERGE_KEYS[field];
      out[field] = key && Array.isArray(out[field]) ? mergeList(out[field], value, key) : structuredClone(value);
    } else if (typeof value === "object") {
      out[field] = merge(out[field] && typeof out[field] === "object" ? out[field] : {}, value);
    } else {
      out[field] = value;
    }
  }
  return out;
}

function applyImages(object, images) {
  const spec = object.spec?.template?.spec ?? object.spec?.jobTemplate?.spec?.template?.spec;
  if (!spec) return;
  for (const list of [spec.containers ?? [], spec.initContainers ?? []]) {
    for (const container of list) {
      const [name, tag] = splitImage(container.image);
      const rule = images.find((i) => i.name === name);
      if (!rule) continue;
      const newName = rule.newName ?? name;
      const newTag = rule.newTag ?? tag;
      container.image = newTag === undefined ? newName : `${newName}:${newTag}`;
    }
  }
}

function splitImage(image) {
  const slash = image.lastIndexOf("/");
  const colon = image.lastIndexOf(":");
  return colon > slash ? [image.slice(0, colon), image.slice(colon + 1)] : [image, undefined];
}

// Renders the kustomization in `dir`; returns the objects in resource order.
export function render(dir) {
  const file = path.join(dir, "kustomization.yaml");
  const [kustomization] = readYamlDocuments(file);
  for (const field of Object.keys(kustomization)) {
    if (!KNOWN_FIELDS.has(field)) throw new Error(`${file}: field "${field}" is not supported`);
  }
  let objects = [];
  for (const resource of kustomization.resources ?? []) {
    const target = path.join(dir, resource);
    if (fs.statSync(target).isDirectory()) {
      objects.push(...render(target));
    } else {
      objects.push(...readYamlDocuments(target));
    }
  }
  for (const entry of kustomization.patches ?? []) {
    const patches = entry.path
      ? readYamlDocuments(path.join(dir, entry.path))
      : [YAML.parse(entry.patch)];
    for (const patch of patches) {
      const kind = entry.target?.kind ?? patch.kind;
      const name = entry.target?.name ?? patch.metadata?.name;
      const index = objects.findIndex((o) => o.kind === kind && o.metadata?.name === name);
      if (index < 0) throw new Error(`${file}: patch target ${kind}/${name} not found`);
      if (patch.$patch === "delete") {
        objects.splice(index, 1);
      } else {
        objects[index] = merge(objects[index], patch);
      }
    }
  }
  for (const object of objects) applyImages(object, kustomization.images ?? []);
  const seen = new Set();
  for (const object of objects) {
    if (seen.has(idOf(object))) throw new Error(`${file}: ${idOf(object)} defined twice`);
    seen.add(idOf(object));
  }
  return objects;
}
