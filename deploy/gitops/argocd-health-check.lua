-- Argo CD health check for kneepoint.io/ParallelismExperiment, read from the experiment's
-- conditions (the operator's source of truth; status.phase is only a printer column).
-- Install it under resource.customizations.health.kneepoint.io_ParallelismExperiment in
-- argocd-cm (argocd-cm-health.yaml holds this file as that key).
--   Degraded     condition Failed=True (the message says why; it wins over Decided,
--                as in the operator's own phase)
--   Healthy      condition Decided=True for the current generation
--   Progressing  anything else: the ladder is running, waiting for GPUs, or the operator
--                has not yet seen the latest spec; the message is status.message
local hs = {}

local function condition(status, kind)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local status = obj.status
local generation = obj.metadata.generation

if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kneepoint operator to accept the experiment"
  return hs
end

if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the kneepoint operator to observe generation " .. generation
  return hs
end

local failed = condition(status, "Failed")
if failed ~= nil and failed.status == "True" then
  hs.status = "Degraded"
  hs.message = failed.message or status.message or "Failed"
  return hs
end

local decided = condition(status, "Decided")
if decided ~= nil and decided.status == "True" then
  hs.status = "Healthy"
  hs.message = decided.message or status.message or "Decided"
  return hs
end

hs.status = "Progressing"
hs.message = status.message or "Running the parallelism ladder"
return hs
