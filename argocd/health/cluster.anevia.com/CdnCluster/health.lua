-- Argo CD health of a CdnCluster (cluster.anevia.com/v1), from what the operator reports:
-- status.observedGeneration, the kstatus conditions Ready, Reconciling, Stalled, and status.state.
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
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to report a status"
  return hs
end

-- A status written for an older spec says nothing about the current one.
local generation = obj.metadata.generation
-- (A status without observedGeneration comes from an older operator: taken as current.)
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to observe generation " .. tostring(generation)
  return hs
end

local stalled = condition(status, "Stalled")
if status.state == "Invalid" or (stalled ~= nil and stalled.status == "True") then
  hs.status = "Degraded"
  hs.message = describe(stalled, "The spec cannot be served")
  return hs
end

local ready = condition(status, "Ready")
local reconciling = condition(status, "Reconciling")
if ready ~= nil and ready.status == "True" and (reconciling == nil or reconciling.status ~= "True") then
  hs.status = "Healthy"
  hs.message = describe(ready, "Every replica is ready")
  return hs
end

if status.state == "Running" and ready == nil then
  -- An operator that reports the state only (no conditions).
  hs.status = "Healthy"
  hs.message = "Every replica is ready"
  return hs
end

hs.status = "Progressing"
if status.state == "WaitingSource" then
  hs.message = describe(ready, "Waiting for a source CdnCluster to exist")
elseif reconciling ~= nil and reconciling.status == "True" then
  hs.message = describe(reconciling, "Deploying")
elseif status.state ~= nil then
  hs.message = describe(ready, status.state)
else
  hs.message = describe(ready, "Waiting for cdn-operator")
end
return hs
