// Package requestmodel is what an InferencePool's model configuration makes
// of one request, shared by the reference EPP (pkg/epp) and mci-sidecar
// (which needs a request's criticality before it picks a cluster), so that
// neither links the other:
//
//   - ParseBody reads the model of an OpenAI-style body and rewrites it
//     (WithModel), bounded by DefaultMaxRequestBodyBytes and fuzzed;
//   - ReadRequestHeaders reads the steering headers (objective, fairness
//     ID, model name rewrite) under the GIE and llm-d names;
//   - Models holds a pool's InferenceModels, InferenceObjectives and
//     InferenceModelRewrites (both API groups; ObjectiveFromLLMD and
//     RewriteFromLLMD convert llm-d.ai's) and resolves a request's
//     criticality and target model (Models.Resolve, Models.Criticality);
//   - LoadModelConfig reads them from a YAML file (the EPP's standalone
//     mode).
//
// It does no I/O besides reading the io.Reader it is given.
package requestmodel
