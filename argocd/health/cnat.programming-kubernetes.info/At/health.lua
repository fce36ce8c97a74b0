-- Argo CD health of an At (cnat.programming-kubernetes.info/v1alpha1), from status.phase
-- (PENDING, RUNNING, DONE), status.outcome (Succeeded, Failed), observedGeneration and the Ready
-- condition. A PENDING At waits for a time, like a suspended Job: Suspended, not Progressing.
-- Runs in Argo CD's sandbox: no string library, only base and table functions.
local hs = {}

local function condition(status, type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to schedule the At"
  return hs
end

local generation = obj.metadata.generation
-- (A status without observedGeneration comes from an older operator: taken as current.)
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(status, "Ready")
if status.phase == "PENDING" then
  hs.status = "Suspended"
  hs.message = "Scheduled for " .. tostring(obj.spec.schedule)
elseif status.phase == "RUNNING" then
  hs.status = "Progressing"
  if status.podName ~= nil then
    hs.message = "Running in pod " .. status.podName
  else
    hs.message = "Running"
  end
elseif status.phase == "DONE" then
  if status.outcome == "Failed" then
    hs.status = "Degraded"
    if status.message ~= nil and status.message ~= "" then
      hs.message = status.message
    else
      hs.message = describe(ready, "The command failed")
    end
  else
    -- Succeeded, or an At finished by an operator that did not report outcomes.
    hs.status = "Healthy"
    hs.message = describe(ready, "The command succeeded")
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(status.phase)
end
return hs
