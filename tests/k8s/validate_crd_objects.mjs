// Validates KEDA and Istio custom resources against the CRD schemas packaged by
// @kubernetes-models/keda and @kubernetes-models/istio (generated from KEDA's CRDs and Istio
// 1.29.2's crd-all.gen.yaml). Reads a JSON array of objects on stdin; prints one line per
// object, "ok" or "invalid: <reason>"; exits 1 if any is invalid or of an unknown kind.
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as istio from "@kubernetes-models/istio/networking.istio.io/v1";

const MODELS = {"keda.sh/v1alpha1": keda, "networking.istio.io/v1": istio};

const input = JSON.parse(await new Promise((resolve) => {
  let data = "";
  process.stdin.on("data", (chunk) => (data += chunk));
  process.stdin.on("end", () => resolve(data));
}));
let failed = false;
for (const obj of input) {
  const Model = MODELS[obj.apiVersion]?.[obj.kind];
  if (!Model) {
    console.log(`invalid: no schema for ${obj.apiVersion} ${obj.kind}`);
    failed = true;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log("ok");
  } catch (err) {
    console.log(`invalid: ${obj.kind}/${obj.metadata?.name}: ${String(err.message).slice(0, 500)}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
